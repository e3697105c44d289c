"""The job's function as a worker runs it: made ONCE per worker process, then called for every task.

`ShardJob(Embedder, fn_args=..., fn_kwargs=...)` (fn a class) or a job file with `setup()` names a
function that is expensive to make (a model loaded, moved to the GPU). Each worker process (a
processes-backend worker, a Dask worker, a pod) makes it on its first task and keeps it in a cache
keyed by (pid, the job's identity), so a second task of the same job reuses it and a forked child
never reuses its parent's (a CUDA context does not survive fork).

A failing construction is remembered too: later tasks on that worker fail at once with the same
one-line message (`SetupError`) instead of loading the model again for every task.
"""

from __future__ import annotations

import inspect
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from shardflow.errors import JobError


class SetupError(JobError):
    """The job's per-worker setup (a callable class's constructor, a job file's setup()) raised."""


@dataclass(frozen=True)
class PerWorker:
    """A function made once per worker: `factory(*args, **kwargs)` returns the callable fn.

    `ShardJob` wraps a class given as fn in one; job files with `setup()` give one (`SetupCall`).
    """

    factory: Callable[..., Callable[..., Any]]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # for messages; default: the factory's name

    def __call__(self, *args: Any) -> Any:
        raise TypeError(f"{self.label} is made once per worker by run_task; run the job (or call "
                        "worker_fn(identity, this)) instead of calling it directly")

    @property
    def label(self) -> str:
        return self.name or getattr(self.factory, "__qualname__", type(self.factory).__name__)


class SetupCall:
    """A job file's `setup()` + `process(sample, state)`: setup runs once per worker, its return
    value is handed to every call of process (or process_batch) as the second argument."""

    def __init__(self, setup: Callable[[], Any], process: Callable[[Any, Any], Any]) -> None:
        self.state = setup()
        self.process = process
        self.__name__ = getattr(process, "__name__", "process")

    def __call__(self, item: Any) -> Any:
        return self.process(item, self.state)


def per_worker(fn: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> PerWorker | None:
    """fn as a PerWorker when it is one or is a class (constructed per worker); None for a plain function."""
    if isinstance(fn, PerWorker):
        return fn
    if inspect.isclass(fn):
        return PerWorker(fn, tuple(args), dict(kwargs or {}))
    if args or kwargs:
        raise JobError("fn_args / fn_kwargs are for a class given as fn (constructed once per worker); "
                       f"{getattr(fn, '__name__', type(fn).__name__)} is not a class")
    return None


_made: dict[tuple[int, str], Any] = {}  # (pid, job identity) -> the made fn, or the SetupError it raised
_lock = threading.Lock()  # Dask workers run tasks in threads: construct once even then


def worker_fn(identity: str, made: PerWorker) -> Callable[..., Any]:
    """The function of job `identity` in this process: constructed on first use, then cached.

    Raises SetupError (one line naming the class and the error) when construction fails, now and for
    every later task of the job in this process.
    """
    key = (os.getpid(), identity)
    with _lock:
        found = _made.get(key)
        if found is None:
            for old in [k for k in _made if k[0] != key[0] or k[1] != identity]:
                del _made[old]  # one job per worker at a time: drop a previous run's model
            found = _made[key] = _construct(made)
    if isinstance(found, SetupError):
        raise found
    return found


def _construct(made: PerWorker) -> Any:
    try:
        fn = made.factory(*made.args, **made.kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever setup raised becomes one clear message
        return SetupError(f"setup of {made.label} failed on this worker (pid {os.getpid()}): "
                          f"{type(exc).__name__}: {exc}; it runs once per worker, fix it and rerun")
    if not callable(fn):
        return SetupError(f"{made.label}(...) made a {type(fn).__name__}, which is not callable: "
                          "define __call__(self, sample) (or (self, batch) with batch_size)")
    return fn


def constructions() -> int:
    """How many functions this process has made and keeps (tests, diagnostics)."""
    return sum(1 for k, v in _made.items() if k[0] == os.getpid() and not isinstance(v, SetupError))
