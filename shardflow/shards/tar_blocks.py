"""Exact-size reads over a tar stream, gzip sniffed from its first bytes.

Why not `tarfile`: in stream mode it builds a TarInfo object per member, re-parses pax headers
through several layers and reads in 512-byte steps, which dominates the cost of small samples. Here
reads come out of a large buffer, so a member costs one 512-byte header parse and one slice.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import BinaryIO, Callable

from shardflow.errors import FormatError

_CHUNK = 1 << 20
_DIRECT_READ = 4 << 20  # members at least this large are read from a local file in one piece
_GZIP_MAGIC = b"\x1f\x8b"


class _Prepended:
    """A read()-able stream that first returns `head`, then the rest of `stream`."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = head
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n < 0 or n >= len(self._head):
                out, self._head = self._head, b""
                if n < 0:
                    return out + self._stream.read()
                return out
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._stream.read(n)


class Blocks:
    """Exact-size reads over a stream with a large buffer; tracks the absolute offset.

    `offset` is the position in the (uncompressed) tar stream of the next byte to be read; `short`
    tells whether the last read came up short; `gzipped` whether the stream is being decompressed.
    """

    def __init__(self, read: Callable[[int], bytes], url: str, first: bytes = b"") -> None:
        self._read = read
        self._url = url
        self._buf = first
        self._pos = 0
        self.offset = 0
        self.short = False
        self.gzipped = False
        # A local file (io.BufferedReader that can seek): large members are read with one read(n)
        # after stepping back over what is buffered here, so a 10 MB member is one 10 MB
        # allocation, not a join of two pieces (which would briefly need twice the member's size).
        self.seekable_file: io.BufferedReader | None = None

    def take(self, n: int, skip: int = 0) -> bytes:
        """Return exactly n bytes (fewer only at end of stream), then drop `skip` more (padding).

        Returns the bytes only; whether the skipped bytes were all there is told by `self.short`.
        """
        buf, pos = self._buf, self._pos
        end = pos + n
        if end + skip <= len(buf):
            self._pos = end + skip
            self.offset += n + skip
            return buf[pos:end]
        data = self.read(n)
        if skip and len(data) == n:
            self.read(skip)
        return data

    def read(self, n: int) -> bytes:
        """Exactly n bytes (fewer only at end of stream, then `short` is set), refilling the buffer."""
        buf, pos = self._buf, self._pos
        if pos + n <= len(buf):
            self._pos = pos + n
            self.offset += n
            return buf[pos : pos + n]
        if n >= _DIRECT_READ and self.seekable_file is not None:
            have = len(buf) - pos
            self.seekable_file.seek(-have, io.SEEK_CUR)
            self._buf, self._pos = b"", 0
            data = self._raw(n)
            self.offset += len(data)
            self.short = len(data) < n
            return data
        # Refill: the new chunk becomes the buffer as it is; only the n bytes asked for are joined
        # (the rest of the old buffer, by reference, and the head of the chunk), never the whole
        # chunk again: one copy of the shard's bytes less, and no fresh ~1 MiB buffer per refill.
        parts: list[bytes | memoryview] = [memoryview(buf)[pos:]] if pos < len(buf) else []
        have = len(buf) - pos
        self._buf, self._pos = b"", 0
        while have < n:
            chunk = self._raw(max(n - have, _CHUNK))
            if not chunk:
                break
            need = n - have
            if len(chunk) > need:  # more than asked: keep the chunk, hand on its head
                parts.append(memoryview(chunk)[:need])
                self._buf, self._pos = chunk, need
                have = n
                break
            parts.append(chunk)
            have += len(chunk)
        data = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
        self.offset += have
        self.short = have < n
        return data

    def finish(self) -> None:
        """At the end of the archive: read a gzip stream to its end so its CRC and length are checked."""
        if self.gzipped:
            while self._raw(_CHUNK):
                pass

    def push_back(self, data: bytes) -> None:
        """Make `data` (just taken) the next bytes to be read again."""
        if data:
            self._buf = data + self._buf[self._pos :]
            self._pos = 0
            self.offset -= len(data)
            self.short = False

    def _raw(self, n: int) -> bytes:
        try:
            return self._read(n)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise FormatError(f"corrupt gzip stream: {exc}", url=self._url, offset=self.offset) from exc


def open_blocks(stream: BinaryIO, url: str) -> Blocks:
    """Sniff gzip from the first bytes and return a block reader over the (decompressed) stream."""
    head = stream.read(_CHUNK)
    while 0 < len(head) < 2:  # a stream that returns short reads (socket-like): get the magic
        more = stream.read(_CHUNK)
        if not more:
            break
        head += more
    if head[:2] == _GZIP_MAGIC:
        unzipped = gzip.GzipFile(fileobj=_Prepended(head, stream), mode="rb")  # type: ignore[arg-type]
        blocks = Blocks(unzipped.read, url)
        blocks.gzipped = True
        return blocks
    blocks = Blocks(stream.read, url, head)
    if getattr(stream, "local_file", False):  # a CountingReader over a local file
        blocks.seekable_file = stream  # type: ignore[assignment]
    elif isinstance(stream, io.BufferedReader):
        try:
            if stream.seekable():
                blocks.seekable_file = stream
        except (OSError, ValueError):
            pass
    return blocks
