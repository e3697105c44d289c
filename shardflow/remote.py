"""Object-store I/O that survives the network: resumable ranged reads, backoff, safe uploads.

Reading (`RemoteReader`, what `urls.open_read` returns for s3://, gs://, http(s):// and any other
remote fsspec URL):

- The object's identity is taken once at open (size plus ETag on S3, generation on GCS, whatever
  `info()` gives elsewhere). Bytes are fetched as ranged GETs of `block_size` (8 MiB) with
  `readahead` blocks (1) fetched ahead on a helper thread, so memory stays at about
  `(1 + readahead) * block_size` whatever the object size, and nothing touches local disk.
- Every block is fetched *conditionally*: on S3 with `If-Match: <etag at open>` and the response's
  ETag checked, on GCS pinned to the generation seen at open. An object replaced or deleted during
  the read is an `ObjectChangedError` naming the URL, never a mix of two versions; elsewhere the
  identity is compared again on every retry.
- A dropped connection, a timeout or a 5xx is retried with exponential backoff and jitter
  (`RetryPolicy`); throttling (503 SlowDown, 429) backs off longer. The retry asks for the same range
  again, so the stream the caller sees continues from exactly the byte offset it had reached.
- An object that ends before the size it had at open is an error ("truncated"), not a short shard.

Writing (`open_upload` / `abort_upload`): S3 multipart and GCS resumable uploads stream from memory
(no temp file) and become visible only on a clean `close()`. fsspec's files *commit on garbage
collection* (`AbstractBufferedFile.__del__` calls `close()`; gcsfs defers the same close to a
thread), which would publish a partial object when a writer is dropped after an error. Files from
`open_upload` are switched to a subclass whose finaliser aborts the upload instead.
"""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import random
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from .errors import ShardIOError
from .storage_options import scrub

log = logging.getLogger("shardflow.remote")

T = TypeVar("T")

DEFAULT_BLOCK_SIZE = 8 * 2**20
DEFAULT_READAHEAD = 1
# S3 multipart parts / GCS resumable chunks: >= 5 MiB (S3 minimum), multiple of 256 KiB (GCS).
DEFAULT_UPLOAD_BLOCK_SIZE = 16 * 2**20


# ---------------------------------------------------------------------------------------------
# Retry policy and error classification


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
_TRANSIENT_TYPES = ("ConnectionError", "TimeoutError", "Timeout", "ClientPayloadError", "ClientOSError",
                    "ServerDisconnectedError", "ClientConnectorError", "ClientConnectionError",
                    "ServerTimeoutError", "IncompleteRead", "ProtocolError", "HTTPClientError",
                    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                    "ConnectionClosedError", "ResponseStreamingError", "ChunkedEncodingError",
                    "FSTimeoutError", "ContentLengthError", "TransferEncodingError", "RemoteDisconnected")


class ObjectChangedError(ShardIOError):
    """The object was replaced, deleted or truncated while it was being read."""


def _chain(exc: BaseException) -> list[BaseException]:
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


def classify(exc: BaseException) -> str:
    """FATAL (do not retry), TRANSIENT (retry with backoff) or THROTTLED (retry, back off longer)."""
    if isinstance(exc, (ObjectChangedError, FileNotFoundError, PermissionError, IsADirectoryError,
                        NotADirectoryError, FileExistsError, KeyboardInterrupt, MemoryError)):
        return FATAL
    if isinstance(exc, ShardIOError) and not isinstance(exc, _RetryableShortRead):
        return FATAL
    for item in _chain(exc):
        code = _status(item)
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata") or {}
            code = code or meta.get("HTTPStatusCode")
            err_code = str((response.get("Error") or {}).get("Code", ""))
            if err_code in ("SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
                            "RequestLimitExceeded"):
                return THROTTLED
        if code in (429, "429"):
            return THROTTLED
        text = f"{type(item).__name__} {item}".lower()
        if any(mark in text for mark in _THROTTLE_MARKS):
            return THROTTLED
    for item in _chain(exc):
        if isinstance(item, _RetryableShortRead):
            return TRANSIENT
        if isinstance(item, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return TRANSIENT
        if isinstance(item, OSError) and item.errno in _TRANSIENT_ERRNOS:
            return TRANSIENT
        code = _status(item)
        if code in (500, 502, 503, 504, "500", "502", "503", "504"):
            return TRANSIENT
        names = {cls.__name__ for cls in type(item).__mro__}
        if any(name in names for name in _TRANSIENT_TYPES):
            return TRANSIENT
        text = f"{type(item).__name__} {item}".lower()
        if any(mark in text for mark in _TRANSIENT_MARKS):
            return TRANSIENT
    return FATAL


class _RetryableShortRead(ShardIOError):
    """A range came back shorter than asked: retried, then reported as truncation."""


def describe(exc: BaseException, storage_options: Any = None) -> str:
    """`Type: message` of an exception with credentials scrubbed out."""
    text = str(exc) or repr(exc)
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
            if not isinstance(exc, _RetryableShortRead):
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


# ---------------------------------------------------------------------------------------------
# Sources: fetch byte ranges of one version of one object


def _sync(fs: Any, coro_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from fsspec.asyn import sync

    return sync(fs.loop, coro_fn, *args, **kwargs)


class _Source:
    """Byte ranges of one object, pinned to the version seen by stat()."""

    def __init__(self, fs: Any, path: str, url: str) -> None:
        self.fs = fs
        self.path = path
        self.url = url
        self.size: int | None = None
        self.identity: tuple[Any, ...] | None = None

    def stat(self) -> None:
        try:
            self.fs.invalidate_cache(self.path)
        except Exception:  # noqa: BLE001 - a cache miss costs only a request
            pass
        info = self.info = self.fs.info(self.path)
        if info.get("type") == "directory":
            raise IsADirectoryError(self.path)
        size = info.get("size")
        # None: no size, or ranges refused ("Accept-Ranges: none"): read as one plain stream instead
        self.size = int(size) if size is not None and info.get("partial", True) is not False else None
        self.identity = self._identity(info)

    @staticmethod
    def _identity(info: dict[str, Any]) -> tuple[Any, ...]:
        keys = ("size", "ETag", "etag", "generation", "VersionId", "version_id", "md5Hash", "crc32c",
                "LastModified", "mtime", "updated", "checksum")
        return tuple((k, str(info[k])) for k in keys if info.get(k) is not None)

    def fetch(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start=start, end=end)

    def check_unchanged(self) -> None:
        """Raise ObjectChangedError when the object is no longer the one opened."""
        before = self.identity
        try:
            self.stat()
        except FileNotFoundError as exc:
            raise ObjectChangedError("object was deleted while it was being read", url=self.url) from exc
        if self.identity != before:
            raise ObjectChangedError(
                f"object changed while it was being read (was {_fmt_identity(before)}, now "
                f"{_fmt_identity(self.identity)})",
                url=self.url,
            )


def _fmt_identity(identity: tuple[Any, ...] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in identity or ()) or "unknown"


class _S3Source(_Source):
    """S3 through s3fs: ranged GetObject with If-Match on the ETag seen at open."""

    def stat(self) -> None:
        bucket, key, version = self.fs.split_path(self.path)
        kw = {"VersionId": version} if version else {}
        head = _sync(self.fs, self.fs._call_s3, "head_object", Bucket=bucket, Key=key, **kw)
        self.size = int(head["ContentLength"])
        self.etag = head.get("ETag")
        self.version = version or None
        self.identity = (("size", str(self.size)), ("ETag", str(self.etag)))

    def fetch(self, start: int, end: int) -> bytes:
        return _sync(self.fs, self._fetch, start, end)

    async def _fetch(self, start: int, end: int) -> bytes:
        bucket, key, _ = self.fs.split_path(self.path)
        kw: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
        if self.etag:
            kw["IfMatch"] = self.etag
        if self.version:
            kw["VersionId"] = self.version
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        except FileNotFoundError as exc:
            raise ObjectChangedError("object was deleted while it was being read", url=self.url) from exc
        except OSError as exc:
            text = str(exc).lower()
            if "precondition" in text or "pre-condition" in text or (
                exc.errno == errno.EINVAL and "match" in text
            ):
                raise ObjectChangedError(
                    "object changed while it was being read (ETag no longer matches)", url=self.url
                ) from exc
            raise
        try:
            etag = resp.get("ETag")
            if self.etag and etag and etag != self.etag:
                raise ObjectChangedError(
                    f"object changed while it was being read (ETag {self.etag} at open, {etag} now)",
                    url=self.url,
                )
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    def check_unchanged(self) -> None:
        before = (self.size, self.etag)
        try:
            self.stat()
        except FileNotFoundError as exc:
            raise ObjectChangedError("object was deleted while it was being read", url=self.url) from exc
        if (self.size, self.etag) != before:
            raise ObjectChangedError(
                f"object changed while it was being read (size {before[0]}, ETag {before[1]} at open; "
                f"size {self.size}, ETag {self.etag} now)",
                url=self.url,
            )


class _GCSSource(_Source):
    """GCS through gcsfs: ranged media GETs pinned to the generation seen at open."""

    def stat(self) -> None:
        super().stat()
        self.generation = self.info.get("generation")

    def fetch(self, start: int, end: int) -> bytes:
        url = self.fs.url(self.path, generation=self.generation) if self.generation else self.fs.url(self.path)
        try:
            headers, data = self.fs.call("GET", url, headers={"Range": f"bytes={start}-{end - 1}"})
        except FileNotFoundError as exc:
            raise ObjectChangedError(
                f"object generation {self.generation} is gone: the object was replaced or deleted while "
                f"it was being read",
                url=self.url,
            ) from exc
        got = headers.get("x-goog-generation") if headers is not None else None
        if self.generation and got and str(got) != str(self.generation):
            raise ObjectChangedError(
                f"object changed while it was being read (generation {self.generation} at open, {got} now)",
                url=self.url,
            )
        return data


def make_source(fs: Any, path: str, url: str) -> _Source:
    cls_names = {c.__name__ for c in type(fs).__mro__}
    if "S3FileSystem" in cls_names and hasattr(fs, "_call_s3"):
        return _S3Source(fs, path, url)
    if "GCSFileSystem" in cls_names and hasattr(fs, "call"):
        return _GCSSource(fs, path, url)
    return _Source(fs, path, url)


# ---------------------------------------------------------------------------------------------
# The reader


class RemoteReader(io.RawIOBase):
    """A read()-able stream over a remote object: bounded read-ahead, resumable, version-pinned.

    `resumes` counts the blocks that had to be fetched again after a transient fault.
    """

    def __init__(
        self,
        url: str,
        fs: Any,
        path: str,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        readahead: int = DEFAULT_READAHEAD,
        retry: RetryPolicy = DEFAULT_RETRY,
        storage_options: Any = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.name = url
        self.block_size = max(int(block_size), 64 * 1024)
        self.readahead = max(int(readahead), 0)
        self.retry = retry
        self.resumes = 0
        self._options = storage_options
        self._source = make_source(fs, path, url)
        call_with_retries(self._source.stat, url=url, what="open", retry=retry, storage_options=storage_options)
        if self._source.size is None:
            raise ShardIOError("the server reports no size for this object, so it cannot be read in ranges",
                               url=url)
        self.size: int = self._source.size
        self._pos = 0  # the caller's offset
        self._buf = b""
        self._buf_start = 0
        self._next_fetch = 0  # start of the next block to request
        self._pending: deque[tuple[int, Future[bytes]]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- io.RawIOBase ---------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            offset += self.size
        if offset < 0:
            raise ValueError("negative seek position")
        if not (self._buf_start <= offset <= self._buf_start + len(self._buf)):
            self._drop_pending()
            self._buf, self._buf_start, self._next_fetch = b"", offset, offset
        self._pos = offset
        return offset

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError(f"read from closed stream {self.url}")
        if n is None or n < 0:
            n = max(self.size - self._pos, 0)
        parts: list[bytes] = []
        while n > 0 and self._pos < self.size:
            rel = self._pos - self._buf_start
            if rel >= len(self._buf):
                self._advance()
                continue
            take = min(n, len(self._buf) - rel)
            parts.append(self._buf[rel : rel + take] if (rel or take != len(self._buf)) else self._buf)
            self._pos += take
            n -= take
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._drop_pending()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            self._buf = b""
        super().close()

    # -- blocks ---------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Make the block holding self._pos current (blocks are aligned to where reading began)."""
        self._fill_pipeline()
        start, future = self._pending.popleft()
        self._fill_pipeline()
        data = future.result() if isinstance(future, Future) else future
        self._buf, self._buf_start = data, start

    def _fill_pipeline(self) -> None:
        want = 1 + self.readahead
        while len(self._pending) < want and self._next_fetch < self.size:
            start = self._next_fetch
            end = min(start + self.block_size, self.size)
            self._next_fetch = end
            if self.readahead:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardflow-read")
                self._pending.append((start, self._pool.submit(self._fetch_block, start, end)))
            else:
                done: Future[bytes] = Future()
                try:
                    done.set_result(self._fetch_block(start, end))
                except BaseException as exc:  # noqa: BLE001 - re-raised by result()
                    done.set_exception(exc)
                self._pending.append((start, done))

    def _drop_pending(self) -> None:
        while self._pending:
            _, future = self._pending.popleft()
            future.cancel()

    def _fetch_block(self, start: int, end: int) -> bytes:
        state = {"retried": False}

        def once() -> bytes:
            if state["retried"]:
                self._source.check_unchanged()
            try:
                data = self._source.fetch(start, end)
            except FileNotFoundError as exc:
                raise ObjectChangedError("object was deleted while it was being read", url=self.url) from exc
            if len(data) > end - start:
                raise ShardIOError(f"asked for bytes {start}-{end - 1}, got {len(data)} bytes: the server "
                                   f"does not honour range requests", url=self.url)
            if len(data) < end - start:
                raise _RetryableShortRead(
                    f"truncated: object ended at byte {start + len(data)}, but it had {self.size} bytes "
                    f"when opened",
                    url=self.url,
                )
            return data

        def on_retry(_: int, __: BaseException) -> None:
            state["retried"] = True
            with self._lock:
                self.resumes += 1

        try:
            return call_with_retries(once, url=self.url, what=f"read at byte {start}", retry=self.retry,
                                     storage_options=self._options, on_retry=on_retry)
        except _RetryableShortRead as exc:
            raise ObjectChangedError(exc.reason, url=self.url) from None

    def __repr__(self) -> str:
        return f"<RemoteReader {self.url} at {self._pos}/{self.size}>"


# ---------------------------------------------------------------------------------------------
# Uploads that never publish by accident


_SAFE_CLASSES: dict[type, type] = {}


def _abort_on_finalize(self: Any) -> None:
    """Finaliser of upload files: abort, never commit (fsspec's default would publish)."""
    if getattr(self, "closed", True):
        return
    path = getattr(self, "path", "?")
    log.warning("upload of %s was dropped without close(): aborted, nothing was published", path)
    abort_upload(self, network=not _in_event_loop())


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def make_abort_on_gc(f: Any) -> Any:
    """Switch an fsspec write file to a subclass whose finaliser aborts instead of committing."""
    from fsspec.spec import AbstractBufferedFile

    cls = type(f)
    if not isinstance(f, AbstractBufferedFile) or cls in _SAFE_CLASSES.values():
        return f
    safe = _SAFE_CLASSES.get(cls)
    if safe is None:
        safe = type(f"{cls.__name__}AbortOnGC", (cls,), {"__del__": _abort_on_finalize, "__module__": __name__})
        _SAFE_CLASSES[cls] = safe
    try:
        f.__class__ = safe
    except TypeError:  # a class with __slots__ or a C type: cannot be patched, leave it
        pass
    return f


def open_upload(fs: Any, path: str, *, block_size: int | None = DEFAULT_UPLOAD_BLOCK_SIZE, **kwargs: Any) -> Any:
    """Open `path` for a streaming upload from memory that commits only on close()."""
    if block_size:
        kwargs["block_size"] = block_size
    return make_abort_on_gc(fs.open(path, "wb", **kwargs))


def abort_upload(f: Any, *, network: bool = True) -> None:
    """Abort an upload in progress; the object is not created (or left as it was). Never raises.

    With `network=False` (finalisers, event-loop threads) the upload is only made unpublishable
    locally; S3 then keeps the unfinished multipart parts until the bucket's lifecycle rule for
    incomplete uploads removes them (GCS expires unfinished resumable uploads after a week).
    """
    try:
        f.closed = True  # first: nothing may flush (and so complete) the upload from here on
    except Exception:  # noqa: BLE001
        pass
    if network:
        try:
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()
        except Exception as exc:  # noqa: BLE001 - best effort; the upload is unpublished either way
            log.info("abort of upload %s failed (%s); it was not published", getattr(f, "path", "?"),
                     describe(exc))
    try:
        f.buffer = None
    except Exception:  # noqa: BLE001
        pass
