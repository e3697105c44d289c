"""RemoteReader: a read()-able stream over a remote object that survives the network.

What `schemes.open_read` returns for s3://, gs://, http(s):// and any other remote fsspec URL:

- Bytes are fetched as ranged GETs of `block_size` (8 MiB) with `readahead` blocks (1) fetched ahead
  on a helper thread, so memory stays at about `(1 + readahead) * block_size` whatever the object
  size, and nothing touches local disk.
- Every block comes from a source pinned to the version seen at open (see sources.py): an object
  replaced or deleted during the read is an ObjectChangedError naming the URL, never a mix of two
  versions.
- A dropped connection, a timeout or a 5xx is retried per `RetryPolicy` (see retry.py). The retry
  asks for the same range again, so the stream the caller sees continues from exactly the byte
  offset it had reached.
- An object that ends before the size it had at open is an error ("truncated"), not a short shard.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardflow.errors import ShardIOError
from shardflow.storage.retry import DEFAULT_RETRY, RetryableShortRead, RetryPolicy, call_with_retries
from shardflow.storage.sources import ObjectChangedError, make_source

DEFAULT_BLOCK_SIZE = 8 * 2**20
DEFAULT_READAHEAD = 1


class UnsizedObjectError(ShardIOError):
    """The server gives no size (or refuses ranges) for the object: it can only be read as one stream."""


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
            raise UnsizedObjectError("the server reports no size for this object, so it cannot be read in ranges",
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
            self._source.close()  # e.g. an HTTP body still being streamed
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
                raise RetryableShortRead(
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
        except RetryableShortRead as exc:
            raise ObjectChangedError(exc.reason, url=self.url) from None

    def __repr__(self) -> str:
        return f"<RemoteReader {self.url} at {self._pos}/{self.size}>"
