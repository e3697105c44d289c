"""Deterministic tar writing: identical members in identical order give byte-identical archives
(GNU tar, Python's tarfile and webdataset read them; tests compare with both byte for byte), and
the compression stage a .tar.gz/.tar.bz2/.tar.xz/.tar.zst name gets (shards.formats says which;
deterministic too: no timestamp in a gzip header, no thread-dependent zstd framing).

Members are gathered by reference and handed on in batches of about 1 MiB, so a shard of small
samples costs few large writes and no copies of large members (256 KiB and up; a storage.file_value.FileValue
member, a file, is read and handed on in 1 MiB chunks, never whole). Smaller ones are
joined into one piece per run: the sink's hashing thread takes the GIL back after every piece it
hashes, and while the main thread runs Python that wait is up to the 5 ms switch interval; with 60 KB
members (~17 pieces a batch) the hashing thread spent half its time waiting (0.33 s wall for 0.16 s
of sha256 on a 300 MB shard; joined: 0.25 s, the job 1.3x faster for the same CPU).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, BinaryIO, Sequence
from zlib import adler32

from shardflow.shards.formats import BY_NAME
from shardflow.shards.tar_headers import BLOCK, ZERO_BLOCK
from shardflow.storage.file_value import FileValue

_FLUSH_AT = 1 << 20  # members are handed to the stream in batches of about this many bytes
_BIG = 1 << 18  # pieces at least this large are passed on as they are, never copied into a batch
_PAX_SIZE = 8**11  # sizes from here on do not fit the 11 octal digits of a ustar size field

# Header bytes 157..512: linkname (empty), magic "ustar\0", version "00", empty owner names,
# device numbers and prefix.
_HEADER_TAIL = bytes(100) + b"ustar\x0000" + bytes(BLOCK - 265)
# name, mode + uid + gid, size, mtime, checksum, typeflag, _HEADER_TAIL ("s" fields pad with NULs)
_USTAR = struct.Struct("100s24s12s12s8s1s355s")
_PADDING = [ZERO_BLOCK[:n] for n in range(BLOCK)]  # the zeros that fill a member up to its block


def coalesce(parts: list[bytes]) -> list[bytes]:
    """`parts` with each run of small pieces joined into one: few, large pieces, same bytes."""
    out: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) >= _BIG or isinstance(part, FileValue):
            if small:
                out.append(small[0] if len(small) == 1 else b"".join(small))
                small = []
            out.append(part)
        else:
            small.append(part)
    if small:
        out.append(small[0] if len(small) == 1 else b"".join(small))
    return out


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_payload(name: bytes, size: int) -> bytes:
    records = []
    for key, value in ((b"path", name), (b"size", b"%d" % size)):
        if key == b"size" and size < _PAX_SIZE:
            continue
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + 1
        while len(b"%d" % length) + len(body) != length:
            length += 1
        records.append(b"%d" % length + body)
    return b"".join(records)


class TarStreamWriter:
    """Write a deterministic tar to a binary stream.

    Every header has the same mtime, uid/gid 0, empty owner names and mode 0o444, so identical
    members in identical order give byte-identical archives. Names longer than 100 bytes (or not
    ASCII) and sizes of 8 GiB or more get a pax header, which GNU tar, Python's tarfile and
    webdataset all read.

    Members are gathered (by reference, not copied) and handed to the stream in batches of about
    1 MiB: to `fileobj.write_parts(list_of_bytes)` when the stream has that method (the writer's
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
        self._run: list[bytes] = []  # add()'s pieces of small members, joined into one when handed on
        # The fixed parts of every header, and their byte sum, so a header costs one pack.
        self._ids = _octal(mode, 8) + _octal(0, 8) + _octal(0, 8)  # mode, uid, gid
        self._mtime_field = _octal(mtime, 12)
        self._fixed_sum = sum(self._ids) + sum(self._mtime_field) + 8 * 32 + sum(_HEADER_TAIL)

    @staticmethod
    def member_size(name: str, size: int) -> int:
        """Bytes that add(name, data of `size`) writes, so writers can roll over before a write."""
        total = BLOCK + size + (-size % BLOCK)
        if size < _PAX_SIZE and len(name) <= 100 and name.isascii():  # the common case, without encoding
            return total
        encoded = name.encode("utf-8", "surrogateescape")
        if len(encoded) > 100 or not encoded.isascii() or size >= _PAX_SIZE:  # ustar cannot hold it
            pax = _pax_payload(encoded, size)
            total += BLOCK + len(pax) + (-len(pax) % BLOCK)
        return total

    def add(self, name: str, data: bytes) -> None:
        """Append one regular file.

        A small member's pieces (header, data, padding) go to a run that is joined once when handed
        on, as add_samples does, so flush() has a few pieces to pass on, not four per member."""
        if isinstance(data, FileValue) or len(data) >= _BIG:  # the data stays a piece of its own, never copied
            parts: list[bytes] = []
            size = self._put(name, data, parts)
            for piece in parts:  # its header(s) end the run, its padding starts the next one
                if piece is data:
                    self._run = self._hand_on(self._run)
                    self._pending.append(piece)
                else:
                    self._run.append(piece)
        else:
            size = self._put(name, data, self._run)
        self.bytes_written += size
        self._pending_size += size
        if self._pending_size >= _FLUSH_AT:
            self.flush()

    def add_samples(self, samples: Sequence[Sequence[tuple[str, bytes]]], limit: float) -> int:
        """Append whole samples (each its (name, bytes) members) while the archive, end marker
        included, stays within `limit` bytes; an empty archive takes its first sample whatever its
        size (so ShardWriter can roll over on it). Returns how many samples were added.

        The same bytes as add() member by member, for less per member: the pieces of small samples
        are joined into one piece per run (packing 100k tiny files is mostly this per-member cost)."""
        written = self.bytes_written
        self._run = self._hand_on(self._run)  # what add() left, before anything of these samples
        run: list[bytes] = []  # pieces of small samples, joined into one before they go pending
        count = 0
        try:
            for members in samples:
                parts: list[bytes] = []
                size = 0
                for name, data in members:
                    size += self._put(name, data, parts)
                if written and written + size + 2 * BLOCK > limit:
                    break
                written += size
                count += 1
                self._pending_size += size
                if size < _BIG:
                    run += parts
                else:  # big data stays a piece of its own, never copied
                    run = self._hand_on(run)
                    self._pending += parts
                if self._pending_size >= _FLUSH_AT:
                    run = self._hand_on(run)
                    self.bytes_written = written
                    self.flush()
        finally:  # whole samples only: one that failed half-way (a name that cannot be encoded) is left out
            self._hand_on(run)
            self.bytes_written = written
        return count

    def _hand_on(self, run: list[bytes]) -> list[bytes]:
        """Add a run of small pieces to the pending ones as one piece; returns a new, empty run."""
        if run:
            self._pending.append(b"".join(run))
        return []

    def _put(self, name: str, data: bytes, parts: list[bytes]) -> int:
        """Append one regular file's pieces to `parts` (a pax header first when ustar cannot hold
        its name or size); returns their bytes."""
        encoded = name.encode("utf-8", "surrogateescape")
        size = len(data)
        if len(encoded) <= 100 and size < _PAX_SIZE and encoded.isascii():  # the common member: one call
            return self._put_member(encoded, size, b"0", data, parts)
        payload = _pax_payload(encoded, size)  # ustar cannot hold it
        written = self._put_member(b"././@PaxHeader", len(payload), b"x", payload, parts)
        encoded = encoded[:100] if encoded.isascii() else b"@LongName"
        return written + self._put_member(encoded, 0 if size >= _PAX_SIZE else size, b"0", data, parts)

    def _put_member(self, name: bytes, size: int, typeflag: bytes, data: bytes, parts: list[bytes]) -> int:
        """Append a ustar header (`size` in its size field) then `data` and its padding to `parts`;
        returns their bytes. `name` has at most 100 bytes, so adler32 sums it (and the size field)
        exactly (see tar_headers.byte_sum): chained, adler32 carries on the running sum. Header and
        data in one call: the framing of a member is per-sample work (two calls cost ~100 ns more)."""
        size_field = b"%011o\0" % size
        checksum = self._fixed_sum + typeflag[0] + (adler32(size_field, adler32(name)) & 0xFFFF) - 1
        parts.append(_USTAR.pack(name, self._ids, size_field, self._mtime_field, b"%06o\0 " % checksum, typeflag,
                                 _HEADER_TAIL))
        length = len(data)
        if length:
            parts.append(data)
        padding = -length % BLOCK
        if padding:
            parts.append(_PADDING[padding])
        return BLOCK + length + padding

    def flush(self) -> None:
        """Hand every pending byte to the stream (does not flush the stream itself)."""
        self._run = self._hand_on(self._run)
        if self._pending:
            pending = self._pending
            self._pending = []
            self._pending_size = 0
            chunks = coalesce(pending)
            if any(isinstance(chunk, FileValue) for chunk in chunks):
                self._stream(chunks)
            else:
                self._write(chunks)

    def _write(self, chunks: list[bytes]) -> None:
        write = getattr(self._out, "write_parts", None)
        if write is not None:
            write(chunks)
        else:
            for chunk in chunks:
                self._out.write(chunk)

    def _stream(self, chunks: list[Any]) -> None:
        """Hand on pieces some of which are files (FileValue): each file in chunks of about 1 MiB, so
        memory stays bounded by the sink's bytes in flight whatever the file's size."""
        run: list[bytes] = []
        for chunk in chunks:
            if not isinstance(chunk, FileValue):
                run.append(chunk)
                continue
            if run:
                self._write(run)
                run = []
            for piece in chunk.chunks():
                self._write([piece])
        if run:
            self._write(run)

    def finish(self) -> None:
        """Write the end-of-archive marker (two zero blocks) and flush."""
        self._run = self._hand_on(self._run)
        self._pending.append(ZERO_BLOCK * 2)
        self.bytes_written += 2 * BLOCK
        self.flush()


class CompressStage:
    """A compressor between the tar writer and the sink: what the sink hashes and stores is the
    compressed bytes, so the receipt covers the shard as stored.

    `sink` takes batches through write_parts(list_of_bytes), as the writer's HashingSink does;
    `compressor` is a fresh compress()/flush() object (zlib, bz2, lzma and zstandard's all are). A
    plain tar gets no stage at all: no call per batch when nothing is compressed.
    """

    def __init__(self, sink: Any, compressor: Any) -> None:
        self._sink = sink
        self._compress = compressor.compress
        self._flush = compressor.flush

    def write_parts(self, parts: list[bytes]) -> None:
        compressed = [c for c in map(self._compress, parts) if c]
        if compressed:
            self._sink.write_parts(compressed)

    def write(self, data: bytes) -> int:
        self.write_parts([data])
        return len(data)

    def finish(self) -> None:
        """End the compressed stream (its trailer) and hand it to the sink."""
        tail = self._flush()
        if tail:
            self._sink.write_parts([tail])


def compress_stage(sink: Any, compression: str) -> CompressStage | None:
    """The stage for `compression` (a name of shards.formats, '' for none: then None)."""
    return CompressStage(sink, BY_NAME[compression].compressor()) if compression else None


class GzipStage(CompressStage):
    """Gzip between the tar writer and the sink; deterministic (zlib's gzip header has mtime 0)."""

    def __init__(self, sink: Any, level: int = 6) -> None:
        super().__init__(sink, zlib.compressobj(level, zlib.DEFLATED, 31))
