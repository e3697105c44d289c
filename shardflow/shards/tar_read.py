"""Streaming tar reading: the regular files of a (gzip-compressed) tar, in order, bounded memory.

Supported: ustar, GNU (long names `L`/`K`, base-256 sizes) and pax (`x` headers: path, size), gzip
auto-detected from the magic bytes, multi-member gzip. Directories, links and devices are skipped.
Anything malformed raises FormatError with the byte offset (in the uncompressed tar stream) of the
header at fault; with `resync=True` damaged headers are handed to tar_recover instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Generator, Iterator

from shardflow.errors import FormatError
from shardflow.shards.keys import split_name
from shardflow.shards.tar_blocks import open_blocks
from shardflow.shards.tar_headers import (
    BLOCK,
    REGULAR,
    ZERO_BLOCK,
    checksum_ok,
    cstring,
    header_name,
    member_name,
    parse_number,
    pax_records,
    truncated_header,
)
from shardflow.shards.tar_recover import Carried, Corruption, Resync


@dataclass(slots=True)
class Member:
    """One regular file of the archive: its path, its bytes and where its header starts."""

    name: str
    data: bytes
    offset: int


# The loop is one function on purpose: it runs once per member, and splitting it would add a call
# per member on the hot path; the damage handling it delegates to Resync is what keeps it short.
def iter_members(stream: BinaryIO, url: str = "", *, resync: bool = False) -> Iterator[Member | Corruption]:
    """Yield the regular files of a tar stream in order, one at a time (bounded memory).

    `resync=True`: each damaged region yields one Corruption, then reading resumes at the next valid
    header. Truncation, corrupt gzip and a file that is not a tar raise FormatError in both modes."""
    blocks = open_blocks(stream, url)
    recovery = Resync(blocks, url) if resync else None
    take = blocks.take
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        offset = blocks.offset
        header = take(BLOCK)
        if len(header) < BLOCK:
            raise truncated_header(header, offset, url)
        if header == ZERO_BLOCK:
            if recovery is not None and recovery.pending is not None:
                yield recovery.release_pending(None)
            blocks.finish()
            return
        if not checksum_ok(header):
            carried = yield from _bad_checksum(recovery, header, offset, url, long_name, pax)
            if carried is None:
                return  # the stream ended inside the damage
            long_name, pax = carried
            continue
        typeflag = header[156:157]
        try:
            size = int(pax["size"]) if "size" in pax else parse_number(header[124:136])
            if size < 0:
                raise ValueError(size)
        except ValueError as exc:
            error = FormatError("bad size field in tar header", url=url, offset=offset)
            if recovery is None:
                raise error from exc
            if not (yield from recovery.skip_damage(error)):
                return
            long_name, pax = None, {}
            continue
        data = take(size, -size % BLOCK)
        if len(data) < size or blocks.short:
            raise _truncated_member(member_name(header, long_name, pax), size, len(data), url, offset)
        if typeflag in REGULAR:
            name = pax.get("path") or long_name or header_name(header)
            if recovery is not None and recovery.pending is not None:
                yield recovery.release_pending(name)  # the damaged metadata described this member
            yield Member(name, data, offset)
        elif typeflag in _METADATA:
            try:
                long_name, pax = _metadata(typeflag, data, long_name, pax, url, offset)
            except FormatError:
                if recovery is None:
                    raise
                if not (yield from recovery.skip_damage(FormatError("malformed pax header", url=url, offset=offset))):
                    return
                long_name, pax = None, {}
            continue
        elif recovery is not None and recovery.pending is not None:  # it described a directory or link
            yield recovery.release_pending(None)
        long_name, pax = None, {}


# Entries that describe the next member rather than being one: GNU long name (L) and long link name
# (K), pax extended (x) and global (g) headers.
_METADATA = (b"L", b"x", b"K", b"g")


def _metadata(typeflag: bytes, data: bytes, long_name: str | None, pax: dict[str, str], url: str,
              offset: int) -> Carried:
    """The (long name, pax records) the next member is read with after a metadata entry."""
    if typeflag == b"L":
        return cstring(data).decode("utf-8", "surrogateescape"), pax
    if typeflag == b"x":
        return long_name, pax_records(data, url, offset)
    return long_name, pax  # K and g carry nothing a regular file needs


def _bad_checksum(
    recovery: Resync | None, header: bytes, offset: int, url: str, long_name: str | None, pax: dict[str, str]
) -> Generator[Corruption, None, Carried | None]:
    """A header whose checksum is wrong: raise, or (resync) report it and read on past the damage."""
    if offset == 0 and header[257:262] != b"ustar":
        raise FormatError("not a tar archive (no valid tar header at the start)", url=url, offset=0)
    error = FormatError("bad tar header checksum", url=url, offset=offset)
    if recovery is None:
        raise error
    return (yield from recovery.bad_header(error, header, offset, long_name, pax))


def _truncated_member(name: str, size: int, got: int, url: str, offset: int) -> FormatError:
    """The error for a member whose data (or its block padding) the stream ended inside."""
    missing = f"got {got}" if got < size else "block padding missing"
    return FormatError(f"truncated tar: member {name!r} needs {size} bytes, {missing}",
                       url=url, key=split_name(name)[0], offset=offset)
