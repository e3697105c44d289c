"""How the processes backend's workers start: forked from a fork server that imported, once, the heavy
modules the job needs (which ones: `preload_for`), with multiprocessing's resource tracker quieted."""

from __future__ import annotations

import multiprocessing
import pickletools
import sys

# Modules worth importing once in the fork server rather than in every worker, when the driver uses them.
PRELOAD = ("numpy", "PIL.Image", "simplejpeg", "fsspec", "torch", "torchvision", "torchvision.transforms.v2",
           "torchvision.models", "shardflow.task.run_task",
           "shardflow.codecs", "shardflow.backends.local")
# ... and those every task imports in a worker anyway (seeding, temp names, local files, unpickling the
# job): imported once in the server, not once per worker, i.e. once per job run (issue 16).
WORKER_NEEDS = ("numpy.random", "secrets", "fsspec.implementations.local", "shardflow.job.shard_job",
                "shardflow.storage.openers")


def mp_context(job_bytes: bytes = b"") -> "multiprocessing.context.BaseContext":
    """How worker processes start: `forkserver` where the platform has it, else `spawn`.

    Workers fork from a server process that imported, once, the heavy modules the job needs (torch
    above all: about 2 CPU-seconds per process), so N workers start in milliseconds instead of
    importing N times. The server is a fresh interpreter that ran no torch op, so forking it is safe;
    the driver itself, which may hold threads, is never forked.
    """
    quiet_resource_tracker()
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        preload = preload_for(job_bytes)
        context.set_forkserver_preload(preload)
        return context
    return multiprocessing.get_context("spawn")


def quiet_resource_tracker() -> None:
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


def preload_for(job_bytes: bytes) -> list[str]:
    """The modules the fork server imports: those of PRELOAD the driver imported (torch and torchvision
    only when the pickled job also names them: its function's module globals, a decode spec such as
    "torchrgb"), plus shardflow's and what every task imports.

    A driver that imported torch for its own reasons (a notebook, a training script) no longer makes
    a passthrough job's server import it: 1.5-2 s more start, on every run, before any task. The image
    libraries (numpy, PIL, simplejpeg) cost tens of ms and any decoding job needs them: kept as before.
    Without the job's bytes (empty), every module the driver imported, as before.
    """
    texts = _pickle_texts(job_bytes) if job_bytes else None
    preload = []
    for name in PRELOAD:
        if name.startswith("shardflow"):
            preload.append(name)
        elif name in sys.modules and (texts is None or not name.startswith("torch")
                                      or any(text.startswith("torch") for text in texts)):
            preload.append(name)
    return preload + list(WORKER_NEEDS)


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
