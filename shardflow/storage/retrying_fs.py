"""The run directory's filesystem, retried like shard I/O.

A run directory on an object store is read and written by the driver all through a run (markers,
plan, summary, error logs). Those calls get the same RetryPolicy as shard reads (storage.retry):
transient and throttling errors are retried with backoff; a missing file is an answer, not an
error (FileNotFoundError passes through at once, RunDir relies on it). When the store stays away
past the policy, the call raises StoreLostError: one line saying the store was lost, that what was
written is intact, and to rerun to resume — never a traceback from deep inside the driver.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from shardflow.errors import ShardIOError
from shardflow.storage.retry import DEFAULT_RETRY, FATAL, THROTTLED, RetryPolicy, classify, describe

# the filesystem methods RunDir and read_status use; anything else passes through untouched
RETRIED_METHODS = frozenset({"cat_file", "pipe_file", "exists", "rm", "rm_file", "ls", "cat", "info", "mkdir",
                             "makedirs", "find", "glob", "mv", "copy", "put_file", "get_file"})


class StoreLostError(ShardIOError):
    """The store holding the run directory stayed unreachable past the retry policy."""


class RetryingFileSystem:
    """A proxy of an fsspec filesystem whose RETRIED_METHODS are retried per `retry`."""

    def __init__(self, fs: Any, url: str, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._fs = fs
        self._url = url
        self.retry = retry

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_fs", "_url", "retry"):
            raise AttributeError(name)  # unpickling looks these up before __init__ ran
        attr = getattr(self._fs, name)
        if name not in RETRIED_METHODS or not callable(attr):
            return attr
        return functools.partial(self._call, name, attr)

    def _call(self, name: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        retry, started, retries = self.retry, time.monotonic(), 0
        while True:
            try:
                return func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - classified: fatal ones are raised as they are
                kind = classify(exc)
                elapsed = time.monotonic() - started
                if kind == FATAL:
                    raise
                if retries + 1 >= retry.attempts or (retry.deadline is not None and elapsed >= retry.deadline):
                    raise StoreLostError(
                        f"lost the store of the run directory {self._url}: {name} failed {retries + 1} times in "
                        f"{elapsed:.0f} s ({describe(exc)}); what was written so far is intact: rerun the same "
                        "command to resume") from exc
                delay = retry.delay(retries, throttled=kind == THROTTLED)
                if retry.deadline is not None:
                    delay = max(0.0, min(delay, retry.deadline - elapsed))
                time.sleep(delay)
                retries += 1
