"""Streaming tar reading and deterministic tar writing.

Why not `tarfile`: in stream mode it builds a TarInfo object per member, re-parses pax headers
through several layers and reads in 512-byte steps, which dominates the cost of small samples. Here a
member costs one 512-byte header parse on a large buffer. Supported on read: ustar, GNU (long names
`L`/`K`, base-256 sizes) and pax (`x` headers: path, size), gzip auto-detected from the magic bytes,
multi-member gzip. Directories, links and devices are skipped. Anything malformed raises FormatError
with the byte offset (in the uncompressed tar stream) of the header at fault.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from .errors import FormatError

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(slots=True)
class Member:
    """One regular file of the archive: its path, its bytes and where its header starts."""

    name: str
    data: bytes
    offset: int


@dataclass(slots=True)
class Corruption:
    """Yielded instead of raising when `resync=True`: the archive was damaged at `error.offset`."""

    error: FormatError


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


class _Blocks:
    """Exact-size reads over a stream with a large buffer; tracks the absolute offset."""

    def __init__(self, read, url: str, first: bytes = b"") -> None:
        self._read = read
        self._url = url
        self._buf = first
        self._pos = 0
        self.offset = 0

    def take(self, n: int) -> bytes:
        """Return exactly n bytes, or fewer only at end of stream."""
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            self.offset += n
            return buf[pos:end]
        parts = [buf[pos:]]
        have = len(buf) - pos
        while have < n:
            chunk = self._raw(max(n - have, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        joined = b"".join(parts)
        if have <= n:
            self._buf, self._pos = b"", 0
            self.offset += have
            return joined
        self._buf, self._pos = joined, n
        self.offset += n
        return joined[:n]

    def _raw(self, n: int) -> bytes:
        try:
            return self._read(n)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise FormatError(f"corrupt gzip stream: {exc}", url=self._url, offset=self.offset) from exc


def _open_blocks(stream: BinaryIO, url: str) -> _Blocks:
    """Sniff gzip from the first bytes and return a block reader over the (decompressed) stream."""
    head = stream.read(_CHUNK)
    if head[:2] == _GZIP_MAGIC:
        unzipped = gzip.GzipFile(fileobj=_Prepended(head, stream), mode="rb")  # type: ignore[arg-type]
        return _Blocks(unzipped.read, url)
    return _Blocks(stream.read, url, head)


def _number(field: bytes) -> int:
    """Parse a numeric header field: octal text, or GNU base-256 when the top bit is set."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _number(header[148:156])
    except ValueError:
        return False
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    signed = unsigned - 2 * sum(b for b in header if b > 127)  # old tars summed signed chars
    return stored == signed


def _cstring(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _pax_records(data: bytes, url: str, offset: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
            key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        except ValueError as exc:
            raise FormatError("malformed pax header", url=url, offset=offset) from exc
        if length <= 0:
            raise FormatError("malformed pax header", url=url, offset=offset)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def iter_members(stream: BinaryIO, url: str = "", *, resync: bool = False) -> Iterator[Member | Corruption]:
    """Yield the regular files of a tar stream in order, one at a time (bounded memory).

    With `resync=True`, a damaged header yields a Corruption and reading resumes at the next block
    that is a valid header, so the good members after the damage are still delivered.
    """
    blocks = _open_blocks(stream, url)
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        offset = blocks.offset
        header = blocks.take(BLOCK)
        if len(header) < BLOCK:
            reason = "truncated tar: stream ended without the end-of-archive marker" if not header else (
                f"truncated tar: header needs {BLOCK} bytes, got {len(header)}"
            )
            raise FormatError(reason, url=url, offset=offset)
        if header == _ZERO_BLOCK:
            return
        if not _checksum_ok(header):
            error = FormatError(
                "not a tar archive (bad header checksum)" if offset == 0 else "bad tar header checksum",
                url=url,
                offset=offset,
            )
            if not resync:
                raise error
            yield Corruption(error)
            long_name, pax = None, {}
            continue
        typeflag = header[156:157]
        try:
            size = int(pax["size"]) if "size" in pax else _number(header[124:136])
        except ValueError as exc:
            raise FormatError("bad size field in tar header", url=url, offset=offset) from exc
        data = blocks.take(size)
        if len(data) < size:
            raise FormatError(f"truncated tar: member needs {size} bytes, got {len(data)}", url=url, offset=offset)
        padding = -size % BLOCK
        if padding and len(blocks.take(padding)) < padding:
            raise FormatError("truncated tar: missing block padding", url=url, offset=offset)
        if typeflag == b"L":
            long_name = _cstring(data).decode("utf-8", "surrogateescape")
            continue
        if typeflag == b"x":
            pax = _pax_records(data, url, offset)
            continue
        if typeflag in (b"K", b"g"):
            continue
        if typeflag in _REGULAR:
            name = pax.get("path") or long_name
            if name is None:
                name = _cstring(header[0:100]).decode("utf-8", "surrogateescape")
                if header[257:263] == b"ustar\x00":
                    prefix = _cstring(header[345:500])
                    if prefix:
                        name = prefix.decode("utf-8", "surrogateescape") + "/" + name
            yield Member(name, data, offset)
        long_name, pax = None, {}


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


class TarStreamWriter:
    """Write a deterministic tar to a binary stream.

    Every header has the same mtime, uid/gid 0, empty owner names and mode 0o444, so identical
    members in identical order give byte-identical archives. Names longer than 100 bytes (or not
    ASCII) and sizes of 8 GiB or more get a pax header, which GNU tar, Python's tarfile and
    webdataset all read.
    """

    def __init__(self, fileobj: BinaryIO, *, mtime: int = 0, mode: int = 0o444) -> None:
        self._out = fileobj
        self._mtime = mtime
        self._mode = mode
        self.bytes_written = 0

    @staticmethod
    def member_size(name: str, size: int) -> int:
        """Bytes that add(name, data of `size`) writes, so writers can roll over before a write."""
        total = BLOCK + size + (-size % BLOCK)
        encoded = name.encode("utf-8", "surrogateescape")
        if len(encoded) > 100 or not encoded.isascii() or size >= 8**11:
            pax = _pax_payload(encoded, size)
            total += BLOCK + len(pax) + (-len(pax) % BLOCK)
        return total

    def add(self, name: str, data: bytes) -> None:
        """Append one regular file."""
        encoded = name.encode("utf-8", "surrogateescape")
        size = len(data)
        if len(encoded) > 100 or not encoded.isascii() or size >= 8**11:
            payload = _pax_payload(encoded, size)
            self._emit(self._header(b"././@PaxHeader", len(payload), b"x"), payload)
            encoded = encoded[:100] if encoded.isascii() else b"@LongName"
            size_field = 0 if size >= 8**11 else size
        else:
            size_field = size
        self._emit(self._header(encoded, size_field, b"0"), data)

    def _emit(self, header: bytes, data: bytes) -> None:
        padding = -len(data) % BLOCK
        if len(data) < 65536:
            self._out.write(header + data + _ZERO_BLOCK[:padding])
        else:
            self._out.write(header)
            self._out.write(data)
            if padding:
                self._out.write(_ZERO_BLOCK[:padding])
        self.bytes_written += BLOCK + len(data) + padding

    def _header(self, name: bytes, size: int, typeflag: bytes) -> bytes:
        header = bytearray(BLOCK)
        header[0 : len(name)] = name
        header[100:108] = _octal(self._mode, 8)
        header[108:116] = _octal(0, 8)
        header[116:124] = _octal(0, 8)
        header[124:136] = _octal(size, 12)
        header[136:148] = _octal(self._mtime, 12)
        header[148:156] = b" " * 8
        header[156:157] = typeflag
        header[257:265] = b"ustar\x0000"
        header[148:156] = b"%06o\0 " % sum(header)
        return bytes(header)

    def finish(self) -> None:
        """Write the end-of-archive marker (two zero blocks)."""
        self._out.write(_ZERO_BLOCK * 2)
        self.bytes_written += 2 * BLOCK


def _pax_payload(name: bytes, size: int) -> bytes:
    records = []
    for key, value in ((b"path", name), (b"size", b"%d" % size)):
        if key == b"size" and size < 8**11:
            continue
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + 1
        while len(b"%d" % length) + len(body) != length:
            length += 1
        records.append(b"%d" % length + body)
    return b"".join(records)
