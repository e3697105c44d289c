"""The run directory's filesystem, retried like shard I/O.

A run directory on an object store is read and written by the driver all through a run (markers,
plan, summary, error logs). Those calls get the same RetryPolicy as shard reads (storage.retry):
transient and throttling errors are retried with backoff; a missing file is an answer, not an
error (FileNotFoundError passes through at once, RunDir relies on it). When the store stays away
past the policy, the call raises StoreLostError: one line saying the store was lost, that what was
written is intact, and to rerun to resume — never a traceback from deep inside the driver.

The retry budget is the policy's `deadline` (120 s by default; a job's `retry_budget`, `--retry-budget`)
and it is counted per OUTAGE, not per call: from the first failure until the store answers again, shared
by every call of this filesystem. A store that stays down is given up after about the budget (plus the
last attempt's own timeout), not after the budget once per call the driver and its task retries make
(which took 414 s).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, Callable

from shardflow.errors import ShardIOError
from shardflow.storage.retry import DEFAULT_RETRY, FATAL, THROTTLED, RetryPolicy, classify, describe

# the filesystem methods RunDir and read_status use; anything else passes through untouched
RETRIED_METHODS = frozenset({"cat_file", "pipe_file", "exists", "rm", "rm_file", "ls", "cat", "info", "mkdir",
                             "makedirs", "find", "glob", "mv", "copy", "put_file", "get_file"})


def run_dir_retry(budget: float | None = None) -> RetryPolicy:
    """The policy of a run directory's store. Given a `budget`: retried until the store has been down
    for that many seconds, however many attempts that takes. Without one: DEFAULT_RETRY, its attempts
    per call (about 20-40 s of backoff) within its deadline per outage, so a pod whose store is gone
    exits 75 for its controller to retry soon, rather than waiting out the whole deadline."""
    return DEFAULT_RETRY if budget is None else replace(DEFAULT_RETRY, attempts=1 << 30, deadline=budget)


class StoreLostError(ShardIOError):
    """The store holding the run directory stayed unreachable past the retry policy."""


class RetryingFileSystem:
    """A proxy of an fsspec filesystem whose RETRIED_METHODS are retried per `retry`."""

    def __init__(self, fs: Any, url: str, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._fs = fs
        self._url = url
        self.retry = retry
        self._outage: float | None = None  # time.monotonic() of the first failure of the current outage

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_outage": None}  # another process has seen no outage yet

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_outage": None, **state})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_fs", "_url", "retry", "_outage"):
            raise AttributeError(name)  # unpickling looks these up before __init__ ran
        attr = getattr(self._fs, name)
        if name not in RETRIED_METHODS or not callable(attr):
            return attr
        return functools.partial(self._call, name, attr)

    def retried(self, name: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`func(*args, **kwargs)` retried like the methods (a call made through this filesystem's
        underlying one, e.g. storage.s3_listing's); `name` names it in the StoreLostError."""
        return self._call(name, func, *args, **kwargs)

    def _call(self, name: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        retry, retries = self.retry, 0
        while True:
            try:
                answer = func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - classified: fatal ones are raised as they are
                kind = classify(exc)
                if kind == FATAL:
                    if isinstance(exc, FileNotFoundError):
                        self._outage = None  # an answer: the store is there
                    raise
                now = time.monotonic()
                if self._outage is None:
                    self._outage = now
                down = now - self._outage
                if retries + 1 >= retry.attempts or (retry.deadline is not None and down >= retry.deadline):
                    budget = f"; retry budget {retry.deadline:g} s (--retry-budget)" if retry.deadline else ""
                    raise StoreLostError(
                        f"lost the store of the run directory {self._url}: unreachable for {down:.0f} s, {name} "
                        f"failed {retries + 1} times ({describe(exc)}){budget}; what was written so far is "
                        "intact: rerun the same command to resume") from exc
                delay = retry.delay(retries, throttled=kind == THROTTLED)
                if retry.deadline is not None:
                    delay = max(0.0, min(delay, retry.deadline - down))
                time.sleep(delay)
                retries += 1
            else:
                self._outage = None
                return answer
