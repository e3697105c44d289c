"""Streaming decompression of a shard (gzip, bzip2, xz, zstd), sniffed from its first bytes
(shards.formats owns the magic bytes).

Why not gzip.GzipFile / tarfile's stream modes: a GzipFile.read(n) that fails (truncation, a bad
block) loses everything it had decompressed in that call, so a truncated .tgz gave fewer samples
than the bytes hold. Here compressed input is fed in small pieces and every byte decompressed before
the damage is handed out first; the error is raised only when the reader asks for more, with the
offset (in the decompressed stream) where the good data ends. Concatenated streams (multi-member
gzip, pbzip2) are read on; bytes after the last stream that are not another stream are reported
as a warning and ignored (gzip pads with zeros, some tools append junk), as `gzip -d` does.
Nothing here allocates what the data claims: output is produced at most `read(n)` bytes at a time.

zstd (the `zstandard` package, extra `zstd`) is read through its stream reader, the one zstandard API
that bounds its output (its decompressobj hands out all a piece of input holds: 64 KiB of RLE blocks
can claim gigabytes). That reader does not tell a stream cut inside a frame from its end, so a cut
.tar.zst shows up as a truncated tar, which the tar layer reports naming the shard and offset (a cut
that loses only the frame's checksum, after the whole tar, loses no sample and goes unnoticed).
A missing package is a JobError, not a FormatError: the shard is fine, this process cannot read it, so
the task fails (whatever on_error says) instead of the shard being skipped as damaged.
"""

from __future__ import annotations

import bz2
import lzma
import warnings
import zlib
from typing import Any, BinaryIO, Callable

from shardflow.errors import FormatError, JobError, ShardflowWarning
from shardflow.shards.formats import BY_NAME, ZSTD_EXTRA, missing_package, sniff
from shardflow.text import redact_userinfo, safe

__all__ = ["Decompressed", "ZstdDecompressed", "decompressed", "sniff"]

_IN_CHUNK = 1 << 16  # compressed bytes fed to the decompressor at a time
_ZSTD_STEP = 1 << 16  # decompressed bytes asked of zstandard's reader at a time (damage loses at most this)

# name -> decompressor factory (decompress(data, max_length), needs_input/eof, unused_data)
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(wbits=31),
    "bzip2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
}


def decompressed(compression: str, head: bytes, stream: BinaryIO, url: str) -> "Decompressed | ZstdDecompressed":
    """A read(n)-able view of the decompressed bytes of `stream` (whose first bytes are `head`); a
    compression whose package is missing is a one-line JobError naming the shard and the extra."""
    package = missing_package(compression)
    if package is not None:
        raise JobError(f"{compression}-compressed shard, which needs the {package!r} package (not importable "
                       f"here): pip install 'shardflow[{ZSTD_EXTRA}]'", url=url)
    if compression == "zstd":
        return ZstdDecompressed(head, stream, url)
    return Decompressed(compression, head, stream, url)


class Decompressed:
    """A read(n)-able view of the decompressed bytes of `stream` (whose first bytes are `head`)."""

    def __init__(self, compression: str, head: bytes, stream: BinaryIO, url: str) -> None:
        self.compression = compression
        self._magic, self._factory = BY_NAME[compression].magic, _DECOMPRESSORS[compression]
        self._stream = stream
        self._url = url
        self._pending = head  # compressed bytes not yet fed
        self._tail = b""  # compressed input the decompressor held back (max_length reached)
        self._dec = self._factory()
        self._eof = False  # every stream ended cleanly and the input is exhausted
        self._error: FormatError | None = None  # damage found, raised once the good bytes are out
        self.made = 0  # decompressed bytes produced so far: the offset of damage when it is found
        self._zlib = compression == "gzip"

    def read(self, n: int) -> bytes:
        """Up to n decompressed bytes (fewer only at the end); b"" at the end of the last stream."""
        out: list[bytes] = []
        have = 0
        while have < n and not self._eof and self._error is None:
            piece = self._step(n - have)
            if piece:
                out.append(piece)
                have += len(piece)
        if not out and self._error is not None:
            error, self._error = self._error, None
            self._eof = True
            raise error
        return out[0] if len(out) == 1 else b"".join(out)

    def _step(self, want: int) -> bytes:
        """Decompress at most `want` more bytes; damage or the end is recorded in the state."""
        dec = self._dec
        try:
            if dec.eof:
                return self._next_stream()
            if self._zlib:
                data = self._tail or self._feed()
            else:
                data = self._feed() if dec.needs_input else b""
            if data is None:
                return b""
            piece = dec.decompress(data, want)
            if self._zlib:
                self._tail = dec.unconsumed_tail
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            self._error = self._damage(f"{type(exc).__name__}: {exc}")
            return b""
        self.made += len(piece)
        return piece

    def _feed(self) -> bytes | None:
        """The next compressed bytes; None (damage recorded) when the input ends inside a stream."""
        data = self._pending or self._stream.read(_IN_CHUNK)
        self._pending = b""
        if not data:
            self._error = self._damage("the compressed stream ends early (truncated)")
            return None
        return data

    def _next_stream(self) -> bytes:
        """After a stream's end: start the next one, or end (warning about trailing junk)."""
        rest = self._dec.unused_data
        while len(rest) < len(self._magic):
            more = self._stream.read(_IN_CHUNK)
            if not more:
                break
            rest += more
        if rest.lstrip(b"\0").startswith(self._magic):  # the next stream (gzip allows zero padding between)
            self._dec, self._pending = self._factory(), rest.lstrip(b"\0")
            return b""
        self._eof = True
        junk = len(rest.lstrip(b"\0"))
        while True:  # how much follows (read in pieces, never kept)
            more = self._stream.read(_IN_CHUNK)
            if not more:
                break
            junk += len(more) if junk else len(more.lstrip(b"\0"))
        if junk:
            shard = safe(redact_userinfo(self._url))  # a name from data: escaped, as errors are
            warnings.warn(f"shard {shard}: {junk} bytes of non-{self.compression} data after the "
                          f"{self.compression} stream ignored", ShardflowWarning, stacklevel=2)
        return b""

    def _damage(self, why: str) -> FormatError:
        return FormatError(f"corrupt {self.compression} stream: {why}", url=self._url, offset=self.made)


class _Prefixed:
    """`head` then the rest of `stream`, as one read(n)-able source (zstandard's reader pulls it)."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = head
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            return head
        return self._stream.read(_IN_CHUNK if n is None or n < 0 else n)


class ZstdDecompressed:
    """Decompressed's interface for zstd: every byte before damage handed out first, the FormatError
    (with the decompressed offset) raised when more is asked; concatenated frames are read on."""

    compression = "zstd"

    def __init__(self, head: bytes, stream: BinaryIO, url: str) -> None:
        import zstandard  # checked by decompressed(): the extra is installed

        self._error_type = zstandard.ZstdError
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            _Prefixed(head, stream), read_size=_IN_CHUNK, read_across_frames=True)
        self._url = url
        self._error: FormatError | None = None
        self._eof = False
        self.made = 0

    def read(self, n: int) -> bytes:
        """Up to n decompressed bytes (fewer only at the end); b"" at the end of the last frame."""
        out: list[bytes] = []
        have = 0
        while have < n and not self._eof and self._error is None:
            try:
                piece = self._reader.read(min(n - have, _ZSTD_STEP))
            except self._error_type as exc:
                self._error = FormatError(f"corrupt zstd stream: {exc}", url=self._url, offset=self.made)
                break
            if not piece:
                self._eof = True
                break
            out.append(piece)
            have += len(piece)
            self.made += len(piece)
        if not out and self._error is not None:
            error, self._error = self._error, None
            self._eof = True
            raise error
        return out[0] if len(out) == 1 else b"".join(out)
