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


class DecodeError(ShardflowError):
    """A member's bytes could not be decoded by the codec its extension selects."""


class EncodeError(ShardflowError):
    """A value returned by a job could not be encoded for its extension."""


class ShardIOError(ShardflowError):
    """Opening, reading or writing a URL failed (missing object, network, permissions)."""


class PipeError(ShardIOError):
    """A `pipe:` command failed or was not allowed."""


class JobError(ShardflowError):
    """A job's definition or a user function broke the contract (bad return value, key clash)."""


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


def apply_policy(error: ShardflowError, on_error: str, report: Callable[[ShardflowError], None] | None = None,
                 *, stacklevel: int = 3) -> None:
    """What every layer does with a bad sample or damaged region: raise it, or warn (on_error="warn")
    and hand it to `report` so the caller can count or log it."""
    if on_error == RAISE:
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
