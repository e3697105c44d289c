"""Exact-size reads over a tar stream, compression (gzip, bzip2, xz, zstd) sniffed from its first bytes.

Why not `tarfile`: in stream mode it builds a TarInfo object per member, re-parses pax headers
through several layers and reads in 512-byte steps, which dominates the cost of small samples. Here
reads come out of a large buffer, so a member costs one 512-byte header parse and one slice.
Reads are bounded: a header that claims a terabyte makes the reader pull the stream in pieces until
it ends (then the read comes up short), never allocate what the header claims.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO, Callable

from shardflow.errors import FormatError
from shardflow.shards.tar_decompress import decompressed, sniff

_CHUNK = 1 << 20
_MAX_READ = 16 << 20  # the most asked of the underlying stream at once, whatever a header says
_DIRECT_READ = 4 << 20  # members at least this large are read into one allocation (from a local file: one read)


class Blocks:
    """Exact-size reads over a stream with a large buffer; tracks the absolute offset.

    `offset` is the position in the (uncompressed) tar stream of the next byte to be read; `short`
    tells whether the last read came up short; `bad_padding` whether padding skipped by `take` held
    anything but zeros (every tar writer pads with zeros: a sign that a size field lies);
    `compression` names the decompression the stream goes through ('' when none).
    """

    def __init__(self, read: Callable[[int], bytes], url: str, first: bytes = b"") -> None:
        self._read = read
        self._url = url
        self._buf = first
        self._pos = 0
        self.offset = 0
        self.short = False
        self.bad_padding = False
        self.compression = ""
        self.failed: FormatError | None = None  # the compressed stream broke: it reads as ended
        # A local file (io.BufferedReader that can seek): large members are read with one read(n)
        # after stepping back over what is buffered here, so a 10 MB member is one 10 MB
        # allocation, not a join of two pieces (which would briefly need twice the member's size).
        self.seekable_file: io.BufferedReader | None = None

    def take(self, n: int, skip: int = 0) -> bytes:
        """Return exactly n bytes (fewer only at end of stream), then drop `skip` more (padding).

        Returns the bytes only; whether the skipped bytes were all there is told by `self.short`, whether
        they were zeros by `self.bad_padding`.
        """
        buf, pos = self._buf, self._pos
        end = pos + n
        if end + skip <= len(buf):
            self._pos = end + skip
            self.offset += n + skip
            if skip and buf.count(0, end, end + skip) != skip:
                self.bad_padding = True
            return buf[pos:end]
        data = self.read(n)
        if skip and len(data) == n:
            padding = self.read(skip)
            if padding.count(0) != len(padding):
                self.bad_padding = True
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
            del buf  # the old chunk is not kept while the member is read (1 MiB less at the peak)
            file = self.seekable_file
            file.seek(-have, io.SEEK_CUR)
            self._buf, self._pos = b"", 0
            left = os.fstat(file.fileno()).st_size - file.tell()
            data = self._raw(max(0, min(n, left)))  # never allocate more than the file holds
            self.offset += len(data)
            self.short = len(data) < n
            return data
        if _DIRECT_READ <= n <= _MAX_READ:
            return self._read_whole(n)
        # Refill: the new chunk becomes the buffer as it is; only the n bytes asked for are joined
        # (the rest of the old buffer, by reference, and the head of the chunk), never the whole
        # chunk again: one copy of the shard's bytes less, and no fresh ~1 MiB buffer per refill.
        parts: list[bytes | memoryview] = [memoryview(buf)[pos:]] if pos < len(buf) else []
        have = len(buf) - pos
        self._buf, self._pos = b"", 0
        while have < n:
            chunk = self._raw(min(max(n - have, _CHUNK), _MAX_READ))
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

    def _read_whole(self, n: int) -> bytes:
        """A large read from a stream that cannot step back (compressed, remote, a pipe): what is
        buffered, then the stream in pieces of at most 1 MiB, each copied into one n-byte buffer that
        becomes the result. Joining the pieces held the member twice for a moment (a 10 MB member of
        a gzipped shard or through a pipe: +10 MB at the peak). n is at most _MAX_READ, which bounds
        what a lying header gets allocated, as the chunked refill does. io.BytesIO over a fresh
        bytes object lends that object out writable and getvalue() hands it back without a copy
        (CPython; elsewhere it copies, with the same bytes)."""
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        whole = io.BytesIO(bytes(n))
        view = whole.getbuffer()
        view[:have] = memoryview(buf)[pos:]
        self._buf, self._pos = b"", 0
        del buf  # the old chunk is not kept while the rest is read
        while have < n:
            piece = self._raw(min(n - have, _CHUNK))
            if not piece:
                break
            view[have : have + len(piece)] = piece
            have += len(piece)
        view.release()  # no export left: getvalue() can hand the buffer on
        self.offset += have
        self.short = have < n
        return whole.getvalue() if have == n else whole.getvalue()[:have]  # short: the stream ended

    def push_back(self, data: bytes) -> None:
        """Make `data` (just taken) the next bytes to be read again."""
        if data:
            self._buf = data + self._buf[self._pos :]
            self._pos = 0
            self.offset -= len(data)
            self.short = False

    def _raw(self, n: int) -> bytes:
        """Read the underlying stream; a corrupt compressed stream reads as ended here (after every
        good byte), remembered in `failed` so the truncation it causes is told with its cause."""
        if self.failed is not None:
            return b""
        try:
            return self._read(n)
        except FormatError as exc:
            self.failed = exc
            return b""

    def cut(self, error: FormatError) -> FormatError:
        """`error` (a truncation) naming the failure of the compressed stream that caused it, if any."""
        failed = self.failed
        if failed is None:
            return error
        merged = FormatError(f"{failed.reason} (at offset {failed.offset}): {error.reason}", url=error.url,
                             key=error.key, offset=error.offset)
        merged.__dict__.update({k: v for k, v in error.__dict__.items() if k.startswith("next_")})
        return merged

    def check(self) -> None:
        """Before taking the end of the stream for the end of the archive: raise a failure it hides."""
        if self.failed is not None:
            raise self.failed


def open_blocks(stream: BinaryIO, url: str) -> Blocks:
    """Sniff the compression from the first bytes; a block reader over the (decompressed) stream."""
    head = stream.read(_CHUNK)
    while 0 < len(head) < 6:  # a stream that returns short reads (socket-like): get the magic
        more = stream.read(_CHUNK)
        if not more:
            break
        head += more
    compression = sniff(head)
    if compression is not None:
        blocks = Blocks(decompressed(compression, head, stream, url).read, url)
        blocks.compression = compression
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
