"""Local backends: `serial` (one process, in order) and `processes` (a spawn-safe process pool)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Iterator

import cloudpickle

from shardflow.errors import FailureKind
from shardflow.job.progress import Progress
from shardflow.rundir.pids import pid_alive
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.task.devices import gpu_plan, pin_worker
from shardflow.task.run_task import run_task
from shardflow.task.threads import THREAD_VARIABLES, apply_threads

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def execute_serial(job: "ShardJob", tasks: list[Task], progress: Progress,
                   gpus_per_worker: int | None = None) -> Iterator[TaskResult]:
    """Run tasks one after another in this process (debuggable: breakpoints work in fn); it uses the GPUs
    this process sees (gpus_per_worker is accepted for a uniform command line and ignored)."""
    for task in tasks:
        yield run_task(task, job, progress=progress.add_samples)


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


# Modules worth importing once in the fork server rather than in every worker, when the driver uses them.
_PRELOAD = ("numpy", "PIL.Image", "simplejpeg", "fsspec", "torch", "torchvision", "torchvision.transforms.v2",
            "torchvision.models", "shardflow.task.run_task",
            "shardflow.codecs", "shardflow.backends.local")
# ... and those every task imports in a worker anyway (seeding, temp names, local files, unpickling the
# job): imported once in the server, not once per worker, i.e. once per job run (issue 16).
_WORKER_NEEDS = ("numpy.random", "secrets", "fsspec.implementations.local", "shardflow.job.shard_job",
                 "shardflow.storage.openers")


def _mp_context() -> "multiprocessing.context.BaseContext":
    """How worker processes start: `forkserver` where the platform has it, else `spawn`.

    Workers fork from a server process that imported, once, the heavy modules the driver has
    imported (torch above all: about 2 CPU-seconds per process), so N workers start in milliseconds
    instead of importing N times. The server is a fresh interpreter that ran no torch op, so forking
    it is safe; the driver itself, which may hold threads, is never forked.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        preload = [name for name in _PRELOAD if name in sys.modules or name.startswith("shardflow")]
        preload += _WORKER_NEEDS
        context.set_forkserver_preload(preload)
        return context
    return multiprocessing.get_context("spawn")


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


def _report_samples(count: int) -> None:
    if _worker_queue is not None:
        _worker_queue.put(count)


def _run_in_worker(task: Task) -> TaskResult:
    global _worker_busy
    assert _worker_job is not None
    if _worker_stopping:  # interrupted: tasks already queued to this worker end at once, unstarted
        return TaskResult.failed(task.id, "interrupted before it started", FailureKind.IO)
    _worker_busy = True
    try:
        return run_task(task, _worker_job, progress=_report_samples)
    finally:
        _worker_busy = False


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
    `gpus_per_worker` GPUs, each pinned to its own), at most 2 queued per worker."""
    if not tasks:
        return
    gpus = gpu_plan(job.spec.device, gpus_per_worker)
    workers = max(1, min(workers or (gpus.workers if gpus else default_workers()), len(tasks)))
    context = _mp_context()
    counts = context.Queue()
    slots = None if gpus is None else context.Queue()
    for slot in gpus.slots if gpus else ():
        slots.put(slot)
    threads = gpus.threads(workers) if gpus else _worker_threads(workers)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                               initargs=(cloudpickle.dumps(job), counts, threads, os.getpid(), slots))
    remaining = iter(tasks)
    running: dict[Future, Task] = {}
    clean = False
    finished_any = False
    try:
        for task in remaining:
            running[pool.submit(_run_in_worker, task)] = task
            if len(running) >= 2 * workers:
                break
        while running:
            finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(counts, progress)
            for future in finished:
                task = running.pop(future)
                try:
                    result = future.result()
                except BrokenProcessPool:
                    # a worker died (SIGKILL, out of memory): its tasks are unfinished, a rerun redoes them
                    error = "worker process died (killed or out of memory)"
                    if not finished_any:
                        error += _startup_hint()
                    for lost in [task, *running.values()]:
                        yield TaskResult.failed(lost.id, error, FailureKind.IO)
                    running.clear()
                    break
                finished_any = True
                next_task = next(remaining, None)
                if next_task is not None:
                    running[pool.submit(_run_in_worker, next_task)] = next_task
                yield result
        _drain(counts, progress)
        clean = True
    finally:
        if not clean:  # interrupted or the consumer stopped early: stop the workers now
            for process in list(getattr(pool, "_processes", {}).values()):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)
        counts.close()


def _startup_hint() -> str:
    """Why workers may die before finishing anything: a script without a main guard."""
    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) and not getattr(main, "__spec__", None):
        return (f" before finishing any task; worker processes import the main script ({main.__file__}): "
                "put the code that runs the job under `if __name__ == \"__main__\":`")
    return " before finishing any task"


def _drain(counts: "multiprocessing.Queue[int]", progress: Progress) -> None:
    while True:
        try:
            progress.add_samples(counts.get_nowait())
        except queue.Empty:
            return
