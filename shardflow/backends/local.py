"""Local backends: `serial` (one process, in order) and `processes` (a spawn-safe process pool)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Iterator

import cloudpickle

from shardflow.backends.forkserver import mp_context
from shardflow.backends.groups import take_group
from shardflow.backends.main_guard import check_main_guard
from shardflow.backends.pool_calls import Pool, PoolCalls, killed_its_worker
from shardflow.errors import FailureKind
from shardflow.job.progress import Progress
from shardflow.rundir.pids import pid_alive
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.storage.paths import is_local, local_path
from shardflow.task.context import TaskContext
from shardflow.task.devices import gpu_plan, pin_worker
from shardflow.task.run_task import run_task
from shardflow.task.threads import THREAD_VARIABLES, apply_threads

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def execute_serial(job: "ShardJob", tasks: list[Task], progress: Progress,
                   gpus_per_worker: int | None = None) -> Iterator[TaskResult]:
    """Run tasks one after another in this process (debuggable: breakpoints work in fn); it uses the GPUs
    this process sees (gpus_per_worker is accepted for a uniform command line and ignored)."""
    if not tasks:
        return
    context = job.task_context()  # made once, not by run_task for every task
    for task in tasks:
        yield run_task(task, context, progress=progress.add_samples)


# -- processes -------------------------------------------------------------------------------------
_worker_job: "ShardJob | None" = None
_worker_queue: "multiprocessing.Queue[int] | None" = None


def _init_worker(job_bytes: bytes, counts: "multiprocessing.Queue[int]", threads: int = 0, driver: int = 0,
                 gpu_slots: Any = None) -> None:
    """Unpickle the job once per worker process (cloudpickle: fn may live in __main__ or a job file).

    `threads`: intra-op threads for torch/BLAS in this worker (0: leave the libraries' defaults), so
    N workers on N cores do not run N x N threads. `driver`: the pid of the process running the job;
    the worker exits when it is gone (kill -9), instead of running on as an orphan next to a rerun.
    """
    global _worker_job, _worker_queue
    if gpu_slots is not None:
        pin_worker(gpu_slots)  # CUDA_VISIBLE_DEVICES, before anything starts CUDA
    signal.signal(signal.SIGINT, _interrupt_task)
    if threads:
        apply_threads(threads)  # before the job is unpickled: the libraries it imports read the variables
    threading.Thread(target=_exit_with_driver, args=(driver or os.getppid(), os.getppid()), daemon=True,
                     name="shardflow-driver-watch").start()
    _worker_job = cloudpickle.loads(job_bytes)
    _worker_queue = counts
    torch = sys.modules.get("torch")
    if threads and torch is not None:
        torch.set_num_threads(threads)


def _exit_with_driver(driver: int, parent: int) -> None:
    """Once a second: when the driver has died (or our parent changed: we were orphaned), end this
    worker at once; its task stays unfinished and a rerun redoes it.

    The parent is the driver (spawn) or a fork server, which outlives the driver while workers run.
    """
    while True:
        time.sleep(1.0)
        if os.getppid() != parent or not pid_alive(driver):
            os._exit(1)


# A run this small on a job that reads raw bytes (no decode: passthrough, the shell tools' split, cat -o,
# sort) ends before a pool of workers would have started: it runs in the driver (see _in_driver).
SMALL_RUN_BYTES = 16 << 20


def _in_driver(job: "ShardJob", tasks: list[Task], gpus: Any, workers: int | None) -> bool:
    """Whether the processes backend runs these tasks here, as `serial` would: one task (a pool cannot
    run it faster, its start is all it adds; unless its worker died under it last time), or a raw-bytes
    job on at most SMALL_RUN_BYTES of local inputs when no worker count was asked for. Measured on 2
    cores: a 12 MB passthrough of 4 shards took 2.2 s on processes, 1.3 s serial. A job that decodes
    always gets its pool (a few MB of JPEGs are seconds of work), so does a GPU job (its workers are
    pinned to their GPUs), a `map` job (each sample runs a command), a run with inputs elsewhere (their
    size costs requests) and a run given `workers=N` (the user asked for N processes). A task reading
    stdin (`-`) always runs here.
    """
    from shardflow.job.shell import ShellCommand

    if any(url == "-" for task in tasks for url in task.inputs):
        return True  # stdin is the driver's: a pool worker reading `-` finds an empty stream
    if gpus is not None or os.environ.get("SHARDFLOW_ALWAYS_POOL") == "1":
        return False
    if len(tasks) <= 1:
        return not killed_its_worker(job, tasks[0])  # a task that crashed its worker must not crash the driver
    if workers is not None or isinstance(job.fn, ShellCommand):
        return False
    if job.spec.decode is not None or job.spec.batch_size is not None:
        return False
    total = 0
    for task in tasks:
        for url in task.inputs:
            if not is_local(url):
                return False
            try:
                total += os.stat(local_path(url)).st_size
            except OSError:
                return False  # let the task report it
            if total > SMALL_RUN_BYTES:
                return False
    return True


def _worker_threads(workers: int) -> int:
    """Intra-op threads per worker: 1, or the driver's OMP_NUM_THREADS (passed on explicitly: a fork
    server started earlier holds an older environment); 0 when only MKL/OpenBLAS's are set (the user
    decides per library).

    Parallelism comes from the workers, one per core. Even with spare cores a second torch/OpenMP
    thread does not pay on per-sample work (ops on one image are too small): measured on 2 cores, one
    worker with 2 threads ran the augment job 3x slower and burned 2.5x the CPU of one with 1 thread.
    """
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if any(name in os.environ for name in THREAD_VARIABLES):
        return 0
    return 1


_FLUSH_S = 0.2  # sample counts leave a worker at most this often (and at the end of each call)
_unsent = 0  # samples counted in this worker and not yet sent to the driver
_sent_at = 0.0


def _report_samples(count: int) -> None:
    """run_task's progress callback: counts to the driver at most every _FLUSH_S (a group of tiny tasks
    sends a few messages, not one per task; a long task's counts still move the bar as they come)."""
    global _unsent
    _unsent += count
    if time.monotonic() - _sent_at >= _FLUSH_S:
        _send_samples()


def _send_samples() -> None:
    global _unsent, _sent_at
    if _worker_queue is not None and _unsent:
        _worker_queue.put(_unsent)
    _unsent, _sent_at = 0, time.monotonic()


def _run_group(tasks: list[Task]) -> list[tuple[TaskResult, float]]:
    """What each pool call runs: one task or a group of tiny ones (backends.groups), each through
    run_task alone and recorded alone (its marker, its result): (result, seconds on this worker) per
    task run. The group stops early at a result that ends the run (TaskResult.stops_run): its later
    tasks are left to the driver."""
    global _worker_context
    assert _worker_job is not None
    if _worker_context is None:  # the job's TaskContext, made once per worker as on Dask and Ray
        _worker_context = _worker_job.task_context()
    results: list[tuple[TaskResult, float]] = []
    try:
        for task in tasks:
            started = time.perf_counter()
            result = _run_in_worker(task, _worker_context)
            results.append((result, time.perf_counter() - started))
            if result.stops_run(_worker_context.spec.on_error):
                break
    finally:
        _send_samples()
    return results


def _run_in_worker(task: Task, context: TaskContext) -> TaskResult:
    global _worker_busy
    if _worker_stopping:  # interrupted: tasks already queued to this worker end at once, unstarted
        return TaskResult.failed(task.id, "interrupted before it started", FailureKind.IO)
    _worker_busy = True
    try:
        return run_task(task, context, progress=_report_samples)
    finally:
        _worker_busy = False


_worker_context: TaskContext | None = None
_worker_busy = False
_worker_stopping = False


def _interrupt_task(signum: int, frame: Any) -> None:
    """SIGINT in a worker stops the task it runs (its shard in progress is discarded), once, and every
    task queued to it after that ends unstarted: the first Ctrl-C starts nothing new.

    Ctrl-C in a terminal reaches the driver and every worker, and the driver then signals the workers
    again: later signals, and signals while idle, are ignored; the pool's shutdown ends the worker.
    """
    global _worker_busy, _worker_stopping
    _worker_stopping = True
    if _worker_busy:
        _worker_busy = False
        raise KeyboardInterrupt


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def execute_processes(job: "ShardJob", tasks: list[Task], progress: Progress, *,
                      workers: int | None = None, gpus_per_worker: int | None = None) -> Iterator[TaskResult]:
    """Run tasks on `workers` processes (default: one per core; a GPU job: one per GPU slot of
    `gpus_per_worker` GPUs, each pinned to its own), at most 2 calls queued per worker, tiny tasks
    several per call (backends.groups: one submission and one result message per group); a run too
    small to pay for starting them runs here instead (`_in_driver`; SHARDFLOW_ALWAYS_POOL=1 turns that off)."""
    if not tasks:
        return
    gpus = gpu_plan(job.spec.device, gpus_per_worker)
    if _in_driver(job, tasks, gpus, workers):
        yield from execute_serial(job, tasks, progress)
        return
    check_main_guard("processes backend")  # a script without the main guard: one line, before any worker starts
    workers = max(1, min(workers or (gpus.workers if gpus else default_workers()), len(tasks)))
    job_bytes = cloudpickle.dumps(job)
    context = mp_context(job_bytes)
    threads = gpus.threads(workers) if gpus else _worker_threads(workers)

    def start_pool() -> Pool:
        """A pool of `workers` processes (a new one after a worker died: backends.pool_calls)."""
        counts = context.Queue()
        slots = None if gpus is None else context.Queue()
        for slot in gpus.slots if gpus else ():
            slots.put(slot)
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                       initargs=(job_bytes, counts, threads, os.getpid(), slots))
        return Pool(executor, counts, time.time())

    calls = PoolCalls(start_pool, _run_group, take_group, lambda counts: _drain(counts, progress), job, tasks,
                      workers)
    clean = False
    try:
        calls.top_up()
        while calls.running:
            finished, _ = wait(calls.running, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(calls.pool.counts, progress)
            for future in finished:
                yield from calls.collect(future)
                calls.top_up()  # after the consumer took them: one that stops at a result submits nothing more
        _drain(calls.pool.counts, progress)
        clean = True
    finally:
        pool = calls.pool.executor
        if not clean:  # interrupted or the consumer stopped early: stop the workers now
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)
        if clean:
            _drain(calls.pool.counts, progress)  # the last counts a worker flushed as it ended its call
        calls.pool.counts.close()


def _drain(counts: "multiprocessing.Queue[int]", progress: Progress) -> None:
    while True:
        try:
            progress.add_samples(counts.get_nowait())
        except queue.Empty:
            return
