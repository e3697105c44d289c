"""Local backends: `serial` (one process, in order) and `processes` (a spawn-safe process pool)."""

from __future__ import annotations

import multiprocessing
import os
import pickletools
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
from shardflow.storage.paths import is_local, local_path
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


def _mp_context(job_bytes: bytes = b"") -> "multiprocessing.context.BaseContext":
    """How worker processes start: `forkserver` where the platform has it, else `spawn`.

    Workers fork from a server process that imported, once, the heavy modules the job needs (torch
    above all: about 2 CPU-seconds per process), so N workers start in milliseconds instead of
    importing N times. The server is a fresh interpreter that ran no torch op, so forking it is safe;
    the driver itself, which may hold threads, is never forked.
    """
    _quiet_resource_tracker()
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        preload = _preload_for(job_bytes)
        context.set_forkserver_preload(preload)
        return context
    return multiprocessing.get_context("spawn")


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its "leaked semaphore objects" warning filtered.

    When the driver is killed (SIGKILL, OOM), the tracker removes the pool's semaphores, which is its
    job, and then warned "There appear to be 8 leaked semaphore objects to clean up at shutdown": a
    scary line after a kill that leaks nothing. The tracker is a separate interpreter started with the
    driver's -W options (sys.warnoptions), so the filter goes there, for that process only.
    """
    from multiprocessing import resource_tracker

    option = "ignore:resource_tracker:UserWarning"
    added = option not in sys.warnoptions
    if added:
        sys.warnoptions.append(option)
    try:
        resource_tracker.ensure_running()
    finally:
        if added:
            sys.warnoptions.remove(option)


def _preload_for(job_bytes: bytes) -> list[str]:
    """The modules the fork server imports: those of _PRELOAD the driver imported (torch and torchvision
    only when the pickled job also names them: its function's module globals, a decode spec such as
    "torchrgb"), plus shardflow's and what every task imports.

    A driver that imported torch for its own reasons (a notebook, a training script) no longer makes
    a passthrough job's server import it: 1.5-2 s more start, on every run, before any task. The image
    libraries (numpy, PIL, simplejpeg) cost tens of ms and any decoding job needs them: kept as before.
    Without the job's bytes (empty), every module the driver imported, as before.
    """
    texts = _pickle_texts(job_bytes) if job_bytes else None
    preload = []
    for name in _PRELOAD:
        if name.startswith("shardflow"):
            preload.append(name)
        elif name in sys.modules and (texts is None or not name.startswith("torch")
                                      or any(text.startswith("torch") for text in texts)):
            preload.append(name)
    return preload + list(_WORKER_NEEDS)


def _pickle_texts(data: bytes) -> set[str]:
    """The names the pickle holds: modules of its globals, and string values that are one dotted name
    (cloudpickle's subimport("torch"), a decode spec); not prose such as the source text it carries."""
    texts: set[str] = set()
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                texts.add(str(arg).split()[0])  # "module name"
            elif isinstance(arg, str) and arg.replace(".", "_").isidentifier():
                texts.add(arg)
    except Exception:  # noqa: BLE001 - a pickle we cannot walk: preload as the driver imported
        return set(sys.modules)
    return texts


# A run this small on a job that reads raw bytes (no decode: passthrough, the shell tools' split, cat -o,
# sort) ends before a pool of workers would have started: it runs in the driver (see _in_driver).
SMALL_RUN_BYTES = 16 << 20


def _in_driver(job: "ShardJob", tasks: list[Task], gpus: Any, workers: int | None) -> bool:
    """Whether the processes backend runs these tasks here, as `serial` would: one task (a pool cannot
    run it faster, its start is all it adds), or a raw-bytes job on at most SMALL_RUN_BYTES of local
    inputs when no worker count was asked for. Measured on 2 cores: a 12 MB passthrough of 4 shards
    took 2.2 s on processes, 1.3 s serial. A job that decodes always gets its pool (a few MB of JPEGs
    are seconds of work), so does a GPU job (its workers are pinned to their GPUs), a `map` job (each
    sample runs a command), a run with inputs elsewhere (their size costs requests) and a run given
    `workers=N` (the user asked for N processes).
    """
    from shardflow.job.shell import ShellCommand

    if gpus is not None or os.environ.get("SHARDFLOW_ALWAYS_POOL") == "1":
        return False
    if len(tasks) <= 1:
        return True
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
    `gpus_per_worker` GPUs, each pinned to its own), at most 2 queued per worker; a run too small to
    pay for starting them runs here instead (`_in_driver`; SHARDFLOW_ALWAYS_POOL=1 turns that off)."""
    if not tasks:
        return
    gpus = gpu_plan(job.spec.device, gpus_per_worker)
    if _in_driver(job, tasks, gpus, workers):
        yield from execute_serial(job, tasks, progress)
        return
    workers = max(1, min(workers or (gpus.workers if gpus else default_workers()), len(tasks)))
    job_bytes = cloudpickle.dumps(job)
    context = _mp_context(job_bytes)
    counts = context.Queue()
    slots = None if gpus is None else context.Queue()
    for slot in gpus.slots if gpus else ():
        slots.put(slot)
    threads = gpus.threads(workers) if gpus else _worker_threads(workers)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                               initargs=(job_bytes, counts, threads, os.getpid(), slots))
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
