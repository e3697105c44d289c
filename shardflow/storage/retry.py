"""Retrying remote operations: which errors are worth another try, and how long to wait.

A dropped connection, a timeout or a 5xx is TRANSIENT and retried with exponential backoff and
jitter; throttling (503 SlowDown, 429) is THROTTLED and backs off longer; anything else (missing
object, permissions, a changed object) is FATAL and raised at once. Errors that give up are
ShardIOErrors naming the URL, with credentials scrubbed out.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from shardflow.errors import ShardIOError
from shardflow.storage.options import scrub

log = logging.getLogger("shardflow.storage.retry")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a remote operation is retried.

    `attempts` counts tries of one operation (one block), the first included. The n-th retry waits
    `min(max_delay, base_delay * 2**n)` scaled by a random factor in [0.5, 1] (so many workers
    hitting the same endpoint spread out); throttling responses wait `throttle_factor` times longer.
    `deadline` (seconds, optional) bounds the total time spent retrying one operation.
    """

    attempts: int = 8
    base_delay: float = 0.25
    max_delay: float = 10.0
    throttle_factor: float = 4.0
    deadline: float | None = 120.0

    def delay(self, retry: int, *, throttled: bool = False) -> float:
        base = self.base_delay * (self.throttle_factor if throttled else 1.0)
        return min(self.max_delay, base * 2**retry) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()

FATAL, TRANSIENT, THROTTLED = "fatal", "transient", "throttled"

_FATAL_TYPES = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
                KeyboardInterrupt, MemoryError)
_THROTTLE_CODES = ("SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded")
_THROTTLE_MARKS = ("slowdown", "slow down", "reduce your request rate", "toomanyrequests",
                   "too many requests", "throttl", "ratelimitexceeded", "rate limit", "requestlimitexceeded",
                   "429")
_TRANSIENT_MARKS = ("connection", "timeout", "timed out", "payload", "disconnected", "incompleteread",
                    "incomplete read", "reset by peer", "broken pipe", "internalerror", "internal error",
                    "serviceunavailable", "service unavailable", "requesttimeout", "bad gateway",
                    "gateway timeout", "503", "500", "502", "504", "temporarily", "eof occurred",
                    "response ended prematurely", "server disconnected")
_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE,
                     errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN,
                     getattr(errno, "EREMOTEIO", errno.EIO)}
_TRANSIENT_STATUSES = (500, 502, 503, 504, "500", "502", "503", "504")
_TRANSIENT_TYPES = ("ConnectionError", "TimeoutError", "Timeout", "ClientPayloadError", "ClientOSError",
                    "ServerDisconnectedError", "ClientConnectorError", "ClientConnectionError",
                    "ServerTimeoutError", "IncompleteRead", "ProtocolError", "HTTPClientError",
                    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                    "ConnectionClosedError", "ResponseStreamingError", "ChunkedEncodingError",
                    "FSTimeoutError", "ContentLengthError", "TransferEncodingError", "RemoteDisconnected")


class RetryableShortRead(ShardIOError):
    """A range came back shorter than asked: retried, then reported as truncation."""


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it (at most 8 deep): libraries wrap the telling error in their own."""
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(out) < 8:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return out


def _status(item: BaseException) -> Any:
    """The HTTP status an exception carries (aiohttp `status`, gcsfs `code`), if any."""
    status = getattr(item, "status", None)
    if status is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            status = getattr(item, "code", None)
    return status


def _text(item: BaseException) -> str:
    return f"{type(item).__name__} {item}".lower()


def _is_throttling(item: BaseException) -> bool:
    code = _status(item)
    response = getattr(item, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata") or {}
        code = code or meta.get("HTTPStatusCode")
        if str((response.get("Error") or {}).get("Code", "")) in _THROTTLE_CODES:
            return True
    if code in (429, "429"):
        return True
    return any(mark in _text(item) for mark in _THROTTLE_MARKS)


def _is_transient(item: BaseException) -> bool:
    if isinstance(item, (RetryableShortRead, ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(item, OSError) and item.errno in _TRANSIENT_ERRNOS:
        return True
    if _status(item) in _TRANSIENT_STATUSES:
        return True
    names = {cls.__name__ for cls in type(item).__mro__}
    if any(name in names for name in _TRANSIENT_TYPES):
        return True
    return any(mark in _text(item) for mark in _TRANSIENT_MARKS)


def classify(exc: BaseException) -> str:
    """FATAL (do not retry), TRANSIENT (retry with backoff) or THROTTLED (retry, back off longer)."""
    if isinstance(exc, _FATAL_TYPES):
        return FATAL
    if isinstance(exc, ShardIOError) and not isinstance(exc, RetryableShortRead):
        return FATAL  # shardflow's own verdicts (a changed object, a refused range) are final
    chain = _chain(exc)
    if any(_is_throttling(item) for item in chain):
        return THROTTLED
    if any(_is_transient(item) for item in chain):
        return TRANSIENT
    return FATAL


def describe(exc: BaseException, storage_options: Any = None) -> str:
    """`Type: message` of an exception with credentials scrubbed out, on one line: a store client's
    message may span lines (botocore's "Parameter validation failed:\nInvalid length ..."), and every
    error shardflow shows is one line (escaped, its newlines would read as a literal backslash-n)."""
    text = " ".join(line.strip() for line in (str(exc) or repr(exc)).splitlines() if line.strip())
    return scrub(f"{type(exc).__name__}: {text}", storage_options)


def call_with_retries(
    func: Callable[[], T],
    *,
    url: str,
    what: str,
    retry: RetryPolicy = DEFAULT_RETRY,
    storage_options: Any = None,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Run `func` until it succeeds, retrying transient and throttling errors per `retry`.

    A fatal error, or the last transient one, is raised as ShardIOError naming `url` (scrubbed of
    credentials), chained to the original.
    """
    started = time.monotonic()
    retries = 0
    while True:
        try:
            return func()
        except ShardIOError as exc:
            if not isinstance(exc, RetryableShortRead):
                raise
            error: BaseException = exc
        except FileNotFoundError as exc:
            raise ShardIOError(f"{what}: no such file or object", url=url) from exc
        except Exception as exc:  # noqa: BLE001 - classified below
            error = exc
        kind = classify(error)
        elapsed = time.monotonic() - started
        if kind == FATAL or retries + 1 >= retry.attempts or (
            retry.deadline is not None and elapsed >= retry.deadline
        ):
            if isinstance(error, ShardIOError):
                raise error
            suffix = f" (after {retries + 1} attempts)" if retries else ""
            raise ShardIOError(f"{what} failed{suffix}: {describe(error, storage_options)}", url=url) from error
        delay = retry.delay(retries, throttled=kind == THROTTLED)
        if retry.deadline is not None:
            delay = max(0.0, min(delay, retry.deadline - elapsed))
        log.warning("%s: %s %s (%s), retry %d in %.2fs", url, what, kind, describe(error, storage_options),
                    retries + 1, delay)
        if on_retry is not None:
            on_retry(retries, error)
        time.sleep(delay)
        retries += 1
