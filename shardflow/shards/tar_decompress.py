"""Streaming decompression of a shard (gzip, bzip2, xz), sniffed from its first bytes.

Why not gzip.GzipFile / tarfile's stream modes: a GzipFile.read(n) that fails (truncation, a bad
block) loses everything it had decompressed in that call, so a truncated .tgz gave fewer samples
than the bytes hold. Here compressed input is fed in small pieces and every byte decompressed before
the damage is handed out first; the error is raised only when the reader asks for more, with the
offset (in the decompressed stream) where the good data ends. Concatenated streams (multi-member
gzip, pbzip2) are read on; bytes after the last stream that are not another stream are reported
as a warning and ignored (gzip pads with zeros, some tools append junk), as `gzip -d` does.
Nothing here allocates what the data claims: output is produced at most `read(n)` bytes at a time.
"""

from __future__ import annotations

import bz2
import lzma
import warnings
import zlib
from typing import Any, BinaryIO, Callable

from shardflow.errors import FormatError, ShardflowWarning

_IN_CHUNK = 1 << 16  # compressed bytes fed to the decompressor at a time

# name, magic, decompressor factory
_FORMATS: tuple[tuple[str, bytes, Callable[[], Any]], ...] = (
    ("gzip", b"\x1f\x8b", lambda: zlib.decompressobj(wbits=31)),
    ("bzip2", b"BZh", bz2.BZ2Decompressor),
    ("xz", b"\xfd7zXZ\x00", lzma.LZMADecompressor),
)


def sniff(head: bytes) -> str | None:
    """The compression of a stream starting with `head` ('gzip', 'bzip2', 'xz'), None if plain."""
    for name, magic, _ in _FORMATS:
        if head.startswith(magic):
            return name
    return None


class Decompressed:
    """A read(n)-able view of the decompressed bytes of `stream` (whose first bytes are `head`)."""

    def __init__(self, compression: str, head: bytes, stream: BinaryIO, url: str) -> None:
        self.compression = compression
        self._magic, self._factory = next((m, f) for n, m, f in _FORMATS if n == compression)
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
            warnings.warn(f"shard {self._url}: {junk} bytes of non-{self.compression} data after the "
                          f"{self.compression} stream ignored", ShardflowWarning, stacklevel=2)
        return b""

    def _damage(self, why: str) -> FormatError:
        return FormatError(f"corrupt {self.compression} stream: {why}", url=self._url, offset=self.made)
