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
import io
import zlib
from zlib import adler32
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from .errors import FormatError

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_CHUNK = 1 << 20
_DIRECT_READ = 4 << 20  # members at least this large are read from a local file in one piece
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(slots=True)
class Member:
    """One regular file of the archive: its path, its bytes and where its header starts."""

    name: str
    data: bytes
    offset: int


@dataclass(slots=True)
class Corruption:
    """Yielded instead of raising when `resync=True`: the archive was damaged at `error.offset`.

    `hint` is the name of the member the damaged header described, when that can be told reliably
    (the damaged header's size field leads exactly to a valid header, and its name is clean text);
    None when the damage is too wide to tell. A member whose own header is damaged is never yielded;
    when a damaged pax/GNU long-name header precedes a member, that member is yielded after the
    Corruption (under the recovered name, which is also the hint) so the reader can leave its sample
    out.
    """

    error: FormatError
    hint: str | None = None


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
        data = self._slow(n)
        if skip and len(data) == n:
            self._slow(skip)
        return data

    # A local file (io.BufferedReader that can seek): large members are read with one read(n) after
    # stepping back over what is buffered here, so a 10 MB member is one 10 MB allocation, not a
    # join of two pieces (which would briefly need twice the member's size).
    seekable_file: io.BufferedReader | None = None

    def _slow(self, n: int) -> bytes:
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
        parts = [buf[pos:]] if pos < len(buf) else []
        have = len(buf) - pos
        while have < n:
            chunk = self._raw(max(n - have, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        if have <= n:
            self._buf, self._pos = b"", 0
            self.offset += have
            self.short = have < n
            return joined
        self._buf, self._pos = joined, n
        self.offset += n
        return joined[:n]

    short = False
    gzipped = False

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


def _open_blocks(stream: BinaryIO, url: str) -> _Blocks:
    """Sniff gzip from the first bytes and return a block reader over the (decompressed) stream."""
    head = stream.read(_CHUNK)
    while 0 < len(head) < 2:  # a stream that returns short reads (socket-like): get the magic
        more = stream.read(_CHUNK)
        if not more:
            break
        head += more
    if head[:2] == _GZIP_MAGIC:
        unzipped = gzip.GzipFile(fileobj=_Prepended(head, stream), mode="rb")  # type: ignore[arg-type]
        blocks = _Blocks(unzipped.read, url)
        blocks.gzipped = True
        return blocks
    blocks = _Blocks(stream.read, url, head)
    if isinstance(stream, io.BufferedReader):
        try:
            if stream.seekable():
                blocks.seekable_file = stream
        except (OSError, ValueError):
            pass
    return blocks


def _number(field: bytes) -> int:
    """Parse a numeric header field: octal text, or GNU base-256 when the top bit is set."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _byte_sum(data: bytes) -> int:
    """The sum of the bytes of `data` (at most 512 of them), computed in C.

    adler32's low 16 bits are (1 + sum of the bytes) mod 65521; a 256-byte half sums to at most
    65280, so each half gives its exact sum. About 20x faster than sum() on a header.
    """
    return (adler32(data[:256]) & 0xFFFF) + (adler32(data[256:]) & 0xFFFF) - 2


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _number(header[148:156])
    except ValueError:
        return False
    unsigned = _byte_sum(header) - sum(header[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    signed = unsigned - 2 * sum(b for b in header if b > 127)  # old tars summed signed chars
    return stored == signed


def _cstring(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _key_of(name: str) -> str:
    """The sample key of a member name (samples.split_name's rule; kept here to name errors)."""
    dot = name.find(".", name.rfind("/") + 1)
    return name if dot < 0 else name[:dot]


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
        if length <= 0 or space < 0 or pos + length > len(data):
            raise FormatError("malformed pax header", url=url, offset=offset)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _header_name(header: bytes) -> str:
    name = _cstring(header[0:100]).decode("utf-8", "surrogateescape")
    if header[257:263] == b"ustar\x00":
        prefix = _cstring(header[345:500])
        if prefix:
            name = prefix.decode("utf-8", "surrogateescape") + "/" + name
    return name


def _clean_name(raw: str) -> str | None:
    """`raw` if it is printable text (a plausible member name), else None."""
    if not raw or not raw.isprintable():
        return None
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes: not valid UTF-8, do not trust it
        return None
    return raw


def _truncated(header: bytes, offset: int, url: str) -> FormatError:
    if offset == 0:
        reason = "empty file, not a tar archive" if not header else (
            f"not a tar archive (only {len(header)} bytes, a tar header needs {BLOCK})"
        )
    elif not header:
        reason = "truncated tar: stream ended without the end-of-archive marker"
    else:
        reason = f"truncated tar: header needs {BLOCK} bytes, got {len(header)}"
    return FormatError(reason, url=url, offset=offset)


# A damaged header whose size field says at most this much is checked by reading that far to see
# whether a valid header follows (then exactly one entry is lost and its name is known).
_TRIAL_LIMIT = 64 << 20


def iter_members(stream: BinaryIO, url: str = "", *, resync: bool = False) -> Iterator[Member | Corruption]:
    """Yield the regular files of a tar stream in order, one at a time (bounded memory).

    With `resync=True`, a damaged header yields one Corruption per damaged region and reading
    resumes at the next block that is a valid header, so the good members after the damage are
    still delivered. Truncation and corrupt gzip end the stream with FormatError in both modes.
    A file that does not start with a tar header is "not a tar archive" in both modes.
    """
    blocks = _open_blocks(stream, url)
    take = blocks.take
    long_name: str | None = None
    pax: dict[str, str] = {}
    damage: FormatError | None = None  # scanning forward from this damaged header
    zeros = False  # while scanning: the last block read was all zeros
    pending: FormatError | None = None  # a damaged pax/long-name header describes the next member
    while True:
        offset = blocks.offset
        header = take(BLOCK)
        if len(header) < BLOCK:
            if damage is not None:
                yield Corruption(damage)
                if zeros and not header:
                    return  # the stream is at its end: a gzip stream was checked by reading it
            raise _truncated(header, offset, url)
        if header == _ZERO_BLOCK:
            if damage is None:
                if pending is not None:
                    yield Corruption(pending)
                blocks.finish()
                return
            zeros = True
            continue
        zeros = False
        if not _checksum_ok(header):
            if damage is not None:
                continue  # still inside the damaged region
            if offset == 0 and header[257:262] != b"ustar":
                raise FormatError("not a tar archive (no valid tar header at the start)", url=url, offset=0)
            error = FormatError("bad tar header checksum", url=url, offset=offset)
            if not resync:
                raise error
            if pending is not None:
                yield Corruption(pending)
                pending = None
            hint, long_name, pax, recovered = _try_bound(blocks, header, offset, url, long_name, pax)
            if not recovered:
                damage = error
                long_name, pax = None, {}
            elif hint is None and (long_name is not None or pax):
                pending = error  # the member this metadata describes comes next
            else:
                yield _corruption(error, hint)
                long_name, pax = None, {}
            continue
        if damage is not None:
            yield Corruption(damage)
            damage = None
        typeflag = header[156:157]
        try:
            size = int(pax["size"]) if "size" in pax else _number(header[124:136])
            if size < 0:
                raise ValueError(size)
        except ValueError as exc:
            error = FormatError("bad size field in tar header", url=url, offset=offset)
            if not resync:
                raise error from exc
            damage, long_name, pax = error, None, {}
            continue
        padding = -size % BLOCK
        data = take(size, padding)
        if len(data) < size or blocks.short:
            name = _member_name(header, long_name, pax)
            got = f"got {len(data)}" if len(data) < size else "block padding missing"
            raise FormatError(
                f"truncated tar: member {name!r} needs {size} bytes, {got}",
                url=url, key=_key_of(name), offset=offset,
            )
        if typeflag in _REGULAR:
            name = pax.get("path") or long_name or _header_name(header)
            if pending is not None:
                yield _corruption(pending, _clean_name(name))
                pending = None
            yield Member(name, data, offset)
        elif typeflag == b"L":
            long_name = _cstring(data).decode("utf-8", "surrogateescape")
            continue
        elif typeflag == b"x":
            try:
                pax = _pax_records(data, url, offset)
            except FormatError:
                if not resync:
                    raise
                damage, long_name, pax = FormatError("malformed pax header", url=url, offset=offset), None, {}
            continue
        elif typeflag in (b"K", b"g"):
            continue
        elif pending is not None:  # the damaged metadata described a directory or link
            yield Corruption(pending)
            pending = None
        long_name, pax = None, {}


def _corruption(error: FormatError, hint: str | None) -> Corruption:
    """A Corruption whose error also names the damaged member's key when it is known."""
    return Corruption(error if hint is None else error.with_location(key=_key_of(hint)), hint)


def _member_name(header: bytes, long_name: str | None, pax: dict[str, str]) -> str:
    return pax.get("path") or long_name or _header_name(header)


def _try_bound(
    blocks: _Blocks, header: bytes, offset: int, url: str, long_name: str | None, pax: dict[str, str]
) -> tuple[str | None, str | None, dict[str, str], bool]:
    """After a header with a bad checksum: does its size field lead exactly to a valid header?

    If so, skip that one entry and return (hint, long_name, pax, True): for a regular member the
    hint is its name; for a pax/long-name header its records are taken so the next member gets its
    real name. Otherwise put back what was read and return (None, None, {}, False).
    """
    typeflag = header[156:157]
    if typeflag not in (*_REGULAR, b"L", b"x"):
        return None, None, {}, False
    try:
        size = _number(header[124:136])
    except ValueError:
        return None, None, {}, False
    if not 0 <= size <= _TRIAL_LIMIT:
        return None, None, {}, False
    padded = size + (-size % BLOCK)
    body = blocks._slow(padded)
    after = blocks._slow(BLOCK)
    if len(body) != padded or len(after) != BLOCK or not (after == _ZERO_BLOCK or _checksum_ok(after)):
        blocks.push_back(body + after)
        return None, None, {}, False
    blocks.push_back(after)
    if typeflag == b"L":
        name = _clean_name(_cstring(body[:size]).decode("utf-8", "surrogateescape"))
        if name is None:
            blocks.push_back(body)
            return None, None, {}, False
        return None, name, {}, True
    if typeflag == b"x":
        try:
            records = _pax_records(body[:size], url, offset)
        except FormatError:
            blocks.push_back(body)
            return None, None, {}, False
        return None, None, records, True
    return _clean_name(_member_name(header, long_name, pax)), None, {}, True


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


_FLUSH_AT = 1 << 20  # members are handed to the stream in batches of about this many bytes
_BIG = 1 << 15  # pieces at least this large are passed on as they are, never copied into a batch


def coalesce(parts: list[bytes]) -> list[bytes]:
    """`parts` with each run of small pieces joined into one: few, large pieces, same bytes."""
    out: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) >= _BIG:
            if small:
                out.append(small[0] if len(small) == 1 else b"".join(small))
                small = []
            out.append(part)
        else:
            small.append(part)
    if small:
        out.append(small[0] if len(small) == 1 else b"".join(small))
    return out


def write_parts(out: BinaryIO, parts: list[bytes]) -> None:
    """Write `parts` in order, small pieces joined (see coalesce)."""
    for part in coalesce(parts):
        out.write(part)


class TarStreamWriter:
    """Write a deterministic tar to a binary stream.

    Every header has the same mtime, uid/gid 0, empty owner names and mode 0o444, so identical
    members in identical order give byte-identical archives. Names longer than 100 bytes (or not
    ASCII) and sizes of 8 GiB or more get a pax header, which GNU tar, Python's tarfile and
    webdataset all read.

    Members are gathered (by reference, not copied) and handed to the stream in batches of about
    1 MiB: to `fileobj.write_parts(list_of_bytes)` when the stream has that method (writer.py's
    hashing sink does), else as a few write() calls (small pieces joined, large ones as they are).
    `flush()` hands over what is pending, `finish()` ends the archive and flushes.
    `bytes_written` counts every byte added, pending or not.
    """

    def __init__(self, fileobj: BinaryIO, *, mtime: int = 0, mode: int = 0o444) -> None:
        self._out = fileobj
        self._mtime = mtime
        self._mode = mode
        self.bytes_written = 0
        self._pending: list[bytes] = []
        self._pending_size = 0
        # The fixed parts of every header, and their byte sum, so a header costs two joins.
        self._ids = _octal(mode, 8) + _octal(0, 8) + _octal(0, 8)  # mode, uid, gid
        self._mtime_field = _octal(mtime, 12)
        self._fixed_sum = sum(self._ids) + sum(self._mtime_field) + 8 * 32 + sum(_HEADER_TAIL)

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
        size = len(data)
        padding = -size % BLOCK
        pending = self._pending
        pending.append(header)
        if size:
            pending.append(data)
        if padding:
            pending.append(_ZERO_BLOCK[:padding])
        written = BLOCK + size + padding
        self.bytes_written += written
        self._pending_size += written
        if self._pending_size >= _FLUSH_AT:
            self.flush()

    def _header(self, name: bytes, size: int, typeflag: bytes) -> bytes:
        size_field = b"%011o\0" % size
        checksum = self._fixed_sum + _byte_sum(name) + sum(size_field) + typeflag[0]
        return b"".join((
            name, _ZERO_BLOCK[: 100 - len(name)], self._ids, size_field, self._mtime_field,
            b"%06o\0 " % checksum, typeflag, _HEADER_TAIL,
        ))

    def flush(self) -> None:
        """Hand every pending byte to the stream (does not flush the stream itself)."""
        if self._pending:
            pending = self._pending
            self._pending = []
            self._pending_size = 0
            chunks = coalesce(pending)
            write = getattr(self._out, "write_parts", None)
            if write is not None:
                write(chunks)
            else:
                for chunk in chunks:
                    self._out.write(chunk)

    def finish(self) -> None:
        """Write the end-of-archive marker (two zero blocks) and flush."""
        self._pending.append(_ZERO_BLOCK * 2)
        self.bytes_written += 2 * BLOCK
        self.flush()


# Header bytes 157..512: linkname (empty), magic "ustar\0", version "00", empty owner names,
# device numbers and prefix.
_HEADER_TAIL = bytes(100) + b"ustar\x0000" + bytes(BLOCK - 265)


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
