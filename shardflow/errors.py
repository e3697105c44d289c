"""Exception classes shared by every layer.

Every error a user can see names where it happened (shard URL, sample key, byte offset) and why, so
that a failure in a run over 100,000 shards can be found and fixed without a debugger.
"""

from __future__ import annotations

import warnings
from enum import Enum
from typing import Callable

from shardflow.text import redact_userinfo, safe, safe_repr

_MAX_REASON = 2000


class ShardflowError(Exception):
    """Base class: a reason plus the location (url, key, offset) it applies to."""

    def __init__(
        self,
        reason: str,
        *,
        url: str | None = None,
        key: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.url = url
        self.key = key
        self.offset = offset
        super().__init__(self._message())

    def _message(self) -> str:
        # url, key and reason may come from data: escaped, truncated, URL passwords left out (text.py)
        where = []
        if self.url is not None:
            where.append(f"shard {safe(redact_userinfo(self.url))}")
        if self.key is not None:
            where.append(f"key {safe_repr(self.key)}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        reason = safe(redact_userinfo(self.reason), limit=_MAX_REASON)
        return f"{', '.join(where)}: {reason}" if where else reason

    def __reduce__(self):  # keep the fields when crossing process boundaries (Dask, pools)
        return (_rebuild, (type(self), self.reason, self.url, self.key, self.offset))

    def with_location(self, *, url: str | None = None, key: str | None = None) -> "ShardflowError":
        """Return a copy that also names url/key where this error did not know them."""
        return type(self)(
            self.reason,
            url=self.url if self.url is not None else url,
            key=self.key if self.key is not None else key,
            offset=self.offset,
        )


def _rebuild(cls, reason, url, key, offset):
    return cls(reason, url=url, key=key, offset=offset)


class FormatError(ShardflowError):
    """The bytes are not a valid (gzip-compressed) tar archive: truncated, bad checksum, corrupt gzip."""


class SampleError(ShardflowError):
    """Members do not form valid samples: duplicate extensions, a key seen twice, unwritable names."""


class StrayMember(ShardflowError):
    """A member that belongs to no sample (no extension, a hidden `.name`, macOS `._*` AppleDouble, a stray
    README): left out and reported, never raised and never a failed sample. Not a SampleError: its
    neighbours are whole, and a job counts it apart from its failures (task/failures.py)."""


class DecodeError(ShardflowError):
    """A member's bytes could not be decoded by the codec its extension selects."""


class EncodeError(ShardflowError):
    """A value returned by a job could not be encoded for its extension."""


class ShardIOError(ShardflowError):
    """Opening, reading or writing a URL failed (missing object, network, permissions)."""


class PipeError(ShardIOError):
    """A `pipe:` command failed or was not allowed."""


class PipeNotAllowed(PipeError):
    """A `pipe:` URL where pipes are not allowed: a setting to change, not I/O trouble. Never retried;
    a job meets it at plan time (storage.pipes.refuse_pipes), a task that meets it stops the run."""


class JobError(ShardflowError):
    """A job's definition or a user function broke the contract (bad return value, key clash)."""


class RunStateError(JobError):
    """A file of the run directory cannot be read back (torn, not JSON): names the file and what to do
    (rundir/state_files.py)."""


class SkipSample(Exception):
    """Raise from a job function to drop the current sample; the reason is counted in the stats."""

    def __init__(self, reason: str = "skipped") -> None:
        self.reason = reason
        super().__init__(reason)


class ShardflowWarning(UserWarning):
    """Issued for each skipped problem when on_error="warn"."""


# -- the error policy: one definition for the library, jobs and the reader ---------------------------
RAISE, SKIP, WARN = "raise", "skip", "warn"
ON_ERROR = (RAISE, SKIP, WARN)

# Each entry point keeps the default its users rely on: a library read stops at the first problem,
# a job skips and logs (one bad sample must not kill a run over 100,000 shards), and the training
# reader warns and goes on (a DataLoader worker that raises ends the epoch).
DEFAULT_ON_ERROR_READ = RAISE
DEFAULT_ON_ERROR_JOB = SKIP
DEFAULT_ON_ERROR_READER = WARN


def check_on_error(value: str, *, error: type[Exception] = ValueError) -> str:
    """Validate an on_error value; `error` is the exception type the caller's users expect."""
    if value not in ON_ERROR:
        raise error(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


# -- fatal exceptions: never a skipped sample, whatever the policy ------------------------------------
# They say this PROCESS is broken, not the sample (PEERS.md, lessons: "fatal exceptions never swallowed"):
# a job's task fails (task/failures.SampleFailures.record) and runs again on the next run; the reader and
# read_samples raise them (apply_policy).
# - MemoryError: this process could not hold what the job needs here. Skipping would drop samples that
#   another machine (or the same one with less memory taken) keeps: outputs that depend on where they
#   ran, and holes a rerun never fills (the task is "done"). Failing the task keeps its bytes the same
#   everywhere: written whole, or not at all and retried.
# - SystemError: the interpreter or a C extension found its own state corrupt; nothing after it is sure.
# RecursionError is NOT one: Python unwinds it cleanly and it is the same for a sample on any machine (a
# deeply nested value, a recursive fn), so it is an ordinary sample failure under the policy (a fn that
# raises it on every sample is stopped as a bug, task/failures.user_bug, like any other exception).
FATAL_ERRORS: tuple[type[BaseException], ...] = (MemoryError, SystemError)
_CAUSES_FOLLOWED = 8  # codecs wrap what they met: DecodeError(...) from MemoryError


def fatal_error(error: BaseException) -> BaseException | None:
    """The FATAL_ERRORS exception `error` is or was raised from (its `__cause__` chain), else None.
    Called on failure paths only: a sample that succeeds pays nothing for it."""
    for _ in range(_CAUSES_FOLLOWED):
        if isinstance(error, FATAL_ERRORS):
            return error
        if error.__cause__ is None:
            return None
        error = error.__cause__
    return None


def apply_policy(error: ShardflowError, on_error: str, report: Callable[[ShardflowError], None] | None = None,
                 *, stacklevel: int = 3) -> None:
    """What every layer does with a bad sample or damaged region: raise it, or warn (on_error="warn")
    and hand it to `report` so the caller can count or log it. An error caused by a fatal exception
    (FATAL_ERRORS) is raised whatever `on_error` says."""
    if on_error == RAISE or fatal_error(error) is not None:
        raise error
    if on_error == WARN:
        warnings.warn(str(error), ShardflowWarning, stacklevel=stacklevel)
    if report is not None:
        report(error)


class FailureKind(str, Enum):
    """How a failed task should be treated; stored as its value ("input", "io", "user") in the run
    directory and mapped onto worker exit codes (cluster.contract)."""

    INPUT = "input"  # bad input or a broken job function: retrying gives the same result
    IO = "io"  # storage/network trouble that outlived the retries: worth retrying later
    USER = "user"  # the job function raised and the policy is on_error="raise"

    __str__ = str.__str__
    __format__ = str.__format__
