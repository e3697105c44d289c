"""Streaming tar reading: the regular files of a (compressed) tar, in order, bounded memory.

Supported: ustar, GNU (long names `L`/`K`, base-256 sizes, sparse `S`) and pax (`x` headers: path,
size, GNU sparse records), gzip/bzip2/xz auto-detected from the magic bytes, concatenated streams.
Directories are skipped; links, devices and FIFOs are left out and reported (a NotRegular each, for
the sample layer's error policy: never silently). Anything malformed raises FormatError with the byte
offset (in the uncompressed tar stream) of the header at fault; with `resync=True` the damage is
reported as a Corruption instead and reading goes on (tar_recover holds those rules). A member is
never yielded when the framing around it is in doubt: a padding that is not zeros, or data whose
last block is itself a valid header, means its size field lies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Generator, Iterator

from shardflow.errors import FormatError, SampleError
from shardflow.shards.keys import split_name
from shardflow.shards.tar_blocks import Blocks, open_blocks
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
    stands_in,
    truncated_header,
)
from shardflow.shards.tar_recover import Corruption, Resync
from shardflow.shards.tar_sparse import gnu_extended, gnu_map, is_pax_sparse, pax_map, rebuild

# (long name, pax records) that describe the next member, as the reading loop carries them
Carried = tuple[str | None, dict[str, str]]


@dataclass(slots=True)
class Member:
    """One regular file of the archive: its path, its bytes and where its header starts."""

    name: str
    data: bytes
    offset: int


@dataclass(slots=True)
class NotRegular:
    """A member that holds no bytes of its own for a sample (a hard or symbolic link, a device, a
    FIFO, an unknown type): left out, and said so (`error` names the shard, key, member and type).
    Links are not followed: a hard link's bytes are those of an earlier member, which a streaming
    reader has let go of, and a symlink may point anywhere. Directories are skipped without a word."""

    error: SampleError


# The loop is one function on purpose: it runs once per member, and splitting it would add a call
# per member on the hot path; damage and rare entries (sparse, metadata) are handled by helpers.
def iter_members(stream: BinaryIO, url: str = "", *, resync: bool = False
                 ) -> Iterator[Member | NotRegular | Corruption]:
    """Yield the regular files of a tar stream in order (bounded memory). `resync=True`: each damaged region
    yields a Corruption, reading resumes at the next valid header; truncation, a non-tar always raise."""
    blocks = open_blocks(stream, url)
    recovery = Resync(blocks, url, resync)
    take = blocks.take
    long_name: str | None = None
    pax: dict[str, str] = _NO_PAX
    while True:
        offset = blocks.offset
        header = take(BLOCK)
        if len(header) < BLOCK:
            raise blocks.cut(truncated_header(header, offset, url, pax.get("path") or long_name))
        if header == ZERO_BLOCK or not checksum_ok(header):
            more = yield from _not_a_header(recovery, blocks, header, (long_name, pax), url, offset)
            if not more:
                return
            long_name, pax = None, _NO_PAX
            continue
        typeflag = header[156:157]
        try:
            size = int(pax["size"]) if "size" in pax else parse_number(header[124:136])
        except ValueError:
            size = -1
        if size < 0 or typeflag == b"S":
            more = yield from _rare(recovery, blocks, header, size, (long_name, pax), offset, url)
            if not more:
                return
            long_name, pax = None, _NO_PAX
            continue
        data = take(size, -size % BLOCK)
        if len(data) < size or blocks.short:
            raise blocks.cut(_truncated_member(member_name(header, long_name, pax), size, len(data), url, offset,
                                               typeflag))
        tail = size % BLOCK or BLOCK  # the bytes of data in its last block
        if blocks.bad_padding or (size and tail > 155 and 48 <= data[size - tail + 153] <= 55
                                  and _ends_with_header(data, size)) or (size > BLOCK
                                                                         and _holds_header(data, size - tail)):
            error = _size_lies(blocks, header, (long_name, pax), offset, url)
            if not (yield from recovery.skip(error, _suspects(header, (long_name, pax), data))):
                return
            long_name, pax = None, _NO_PAX
            continue
        if typeflag in REGULAR:
            if long_name is None and not pax:
                if recovery.hit and _stand_in_like(header):  # its pax or long-name record may be lost
                    error = FormatError(f"member {header_name(header)!r} after damage has a name that may stand in "
                                        "for a longer one lost with its pax or long-name record: its sample is unknown",
                                        url=url, offset=offset)
                    if not (yield from recovery.skip(error)):
                        return
                    continue
                yield Member(header_name(header), data, offset)
                continue
            name = pax.get("path") or long_name or header_name(header)
            if pax and is_pax_sparse(pax):
                yield from _pax_sparse(recovery, pax, name, data, url, offset)
            elif not stands_in(header_name(header), name):  # the header is not the one the record was for
                long_name, pax = None, _NO_PAX
                error = _not_its_header(header, name, url, offset)
                if not (yield from recovery.skip(error, (split_name(name)[0], split_name(header_name(header))[0]))):
                    return
                continue
            else:
                yield Member(name, data, offset)
            long_name, pax = None, _NO_PAX
        elif typeflag in _METADATA:
            try:
                long_name, pax = _metadata(typeflag, data, (long_name, pax), url, offset)
            except FormatError as error:
                suspects = _carried_keys((long_name, pax))
                long_name, pax = None, _NO_PAX
                if recovery.resync:
                    _metadata_run(blocks)  # the rest of a run of them is the same damage: one report
                if not (yield from recovery.skip(error, suspects)):
                    return
        else:
            if typeflag not in _NO_DATA:  # a link or a special file: never left out silently
                yield _not_regular(typeflag, header, (long_name, pax), url, offset)
            long_name, pax = None, _NO_PAX


_END_MARKER = bytes(2 * BLOCK)
_NO_PAX: dict[str, str] = {}  # shared, never changed: pax_records makes a new dict for each pax header

# Entries left out without a report: they hold no file (directories, GNU dump directories, volume labels)
_NO_DATA = (b"5", b"D", b"V")
_KINDS = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device", b"4": "a block device",
          b"6": "a FIFO"}


def _not_regular(typeflag: bytes, header: bytes, carried: Carried, url: str, offset: int) -> NotRegular:
    """The report of a member that is not a regular file (see NotRegular)."""
    name = member_name(header, *carried)
    kind = _KINDS.get(typeflag, f"an entry of unknown type {typeflag.decode('latin-1')!r}")
    if typeflag in (b"1", b"2"):
        target = carried[1].get("linkpath") or cstring(header[157:257]).decode("utf-8", "surrogateescape")
        kind += f" to {target!r}"
    return NotRegular(SampleError(f"member {name!r} is {kind}, not a regular file: left out (links are not "
                                  "followed)", url=url, key=split_name(name)[0], offset=offset))


# Entries that describe the next member rather than being one: GNU long name (L) and long link name
# (K), pax extended (x) and global (g) headers.
_METADATA = (b"L", b"x", b"K", b"g")


def _ends_with_header(data: bytes, size: int) -> bool:
    """Whether the member's last block (with its zero padding) is a valid tar header: then the size
    field claimed the next header as data (a cheap pre-check of the checksum field first)."""
    start = size - (size % BLOCK or BLOCK)
    if size - start < 156 or not data[start + 148 : start + 154].strip(b" ").isdigit():
        return False
    block = data[start:]
    return checksum_ok(block + bytes(BLOCK - len(block)))


def _stand_in_like(header: bytes) -> bool:
    """Whether a header's own name may be a writer's stand-in for a longer or non-ASCII name held by
    a pax or GNU long-name record: a full name field (a truncation), '@LongName' (shardflow), '?'
    (tarfile's stand-in for each non-ASCII character)."""
    field = header[:100]
    return field[99] != 0 or field.startswith(b"@LongName\0") or b"?" in cstring(field)


def _holds_header(data: bytes, end: int) -> bool:
    """Whether a block of the member's data before `end` (its last block) is a ustar/GNU tar header:
    a header displaced into the data (two blocks traded places), or members swallowed by a size
    that lies. Only the magic at byte 257 of each block is looked at first (one strided slice: cheap);
    data that is itself a tar (a member that is a .tar: a header in its first block and the two zero
    blocks of an end marker at its end) is exempt."""
    marks = data[257:end:BLOCK]
    found = marks.find(b"u")
    if found < 0 or (data[257:262] == b"ustar" and data.endswith(_END_MARKER) and checksum_ok(data[:BLOCK])):
        return False
    while found >= 0:
        start = found * BLOCK
        if data[start + 257 : start + 262] == b"ustar" and checksum_ok(data[start : start + BLOCK]):
            return True
        found = marks.find(b"u", found + 1)
    return False


def _not_its_header(header: bytes, name: str, url: str, offset: int) -> FormatError:
    return FormatError(f"member {name!r} (named by a pax or long-name record) has a header named "
                       f"{header_name(header)!r}, which no writer puts there for it: a header displaced onto it",
                       url=url, offset=offset)


def _size_lies(blocks: Blocks, header: bytes, carried: Carried, offset: int, url: str) -> FormatError:
    blocks.bad_padding = False
    name = member_name(header, *carried)
    return FormatError(f"the data of member {name!r} does not end where its size field says (non-zero padding, "
                       "or a tar header inside it): the header or the stream is damaged", url=url, offset=offset)


def _not_a_header(recovery: Resync, blocks: Blocks, header: bytes, carried: Carried, url: str, offset: int
                  ) -> Generator[Corruption, None, bool]:
    """A zero block or a bad checksum where a header belongs, after the `carried` pax or long-name
    records (whose member lost its header: a suspect). False when the archive ends here."""
    suspects = _carried_keys(carried)
    if header == ZERO_BLOCK:
        if carried[0] is None and not carried[1]:
            return (yield from recovery.zero_block(offset))
        error = FormatError("a pax or long-name header not followed by its member", url=url, offset=offset)
        return (yield from recovery.skip(error, suspects))
    if offset == 0 and header[257:262] != b"ustar":
        raise _not_tar(blocks, url)
    return (yield from recovery.skip(FormatError("bad tar header checksum", url=url, offset=offset), suspects))


def _metadata_run(blocks: Blocks) -> None:
    """Read past the pax / long-name headers that follow a malformed or repeated one (5,000 chained GNU
    `L` headers gave 2,500 reports, one per pair): the members they described are lost with it. Stops
    before the first block that is not such a header (or one with a bad size); at most 1 MiB of records
    each, which bounds memory as the main loop does."""
    while True:
        header = blocks.take(BLOCK)
        if len(header) < BLOCK or header[156:157] not in _METADATA or not checksum_ok(header):
            blocks.push_back(header)
            return
        try:
            size = parse_number(header[124:136])
        except ValueError:
            size = -1
        if not 0 <= size <= _MAX_RECORDS:
            blocks.push_back(header)
            return
        if len(blocks.take(size, -size % BLOCK)) < size:
            return  # the stream ends here: the skip that follows reports it


_MAX_RECORDS = 1 << 20


def _carried_keys(carried: Carried) -> tuple[str, ...]:
    """The key named by pax or long-name records whose member is lost with damage (none: ())."""
    name = carried[1].get("path") or carried[0]
    return (split_name(name)[0],) if name else ()


def _suspects(header: bytes, carried: Carried, data: bytes) -> tuple[str, ...]:
    """Keys of sound headers in a region whose framing broke: the header whose size lies, and every
    header found at a block boundary of the data it claimed (displaced headers, or the members a
    size too large swallowed). Only ever read on damage: the plain path never looks inside data."""
    keys = [split_name(member_name(header, *carried))[0]] if header[156:157] in REGULAR else []
    for start in range(0, len(data), BLOCK):
        block = data[start : start + BLOCK]
        if len(block) < 156 or not block[148:154].strip(b" ").isdigit():
            continue
        block += bytes(BLOCK - len(block))
        if not checksum_ok(block):
            continue
        name = header_name(block)
        if block[156:157] == b"x":  # a pax header: the path is in its records
            try:
                records = data[start + BLOCK : start + BLOCK + max(0, parse_number(block[124:136]))]
                name = pax_records(records, "", 0).get("path") or ""
            except (FormatError, ValueError):
                name = ""
        elif block[156:157] == b"L":
            name = cstring(data[start + BLOCK : start + 2 * BLOCK]).decode("utf-8", "surrogateescape")
        if name:
            keys.append(split_name(name)[0])
    return tuple(dict.fromkeys(keys))


def _rare(recovery: Resync, blocks: Blocks, header: bytes, size: int, carried: Carried, offset: int,
          url: str) -> Generator[Member | Corruption, None, bool]:
    """A bad size field (damage; `size` < 0) or an old-GNU sparse member; False when the stream ended."""
    if size < 0:
        error = FormatError("bad size field in tar header", url=url, offset=offset)
        return (yield from recovery.skip(error, (split_name(member_name(header, *carried))[0],)))
    name = member_name(header, *carried)
    extensions: list[bytes] = []
    more_blocks = gnu_extended(header[482:483])
    while more_blocks:  # the map goes on in extension blocks between the header and the data
        block = blocks.take(BLOCK)
        if len(block) < BLOCK:
            raise blocks.cut(_truncated_member(name, BLOCK, len(block), url, offset))
        extensions.append(block)
        more_blocks = gnu_extended(block[504:505])
    data = blocks.take(size, -size % BLOCK)
    if len(data) < size or blocks.short:
        raise blocks.cut(_truncated_member(name, size, len(data), url, offset))
    try:
        regions, real = gnu_map(header, extensions)
        member = Member(name, rebuild(regions, real, data, name, url, offset), offset)
    except (ValueError, FormatError) as exc:
        yield from recovery.member_lost(_sparse_error(exc, name, url, offset), split_name(name)[0])
        return True
    yield member
    return True


def _pax_sparse(recovery: Resync, pax: dict[str, str], name: str, data: bytes, url: str, offset: int
                ) -> Generator[Member | Corruption, None, None]:
    """A pax (GNU.sparse.*) sparse member, rebuilt under its real name, or reported when it cannot be."""
    try:
        regions, real, stored, real_name = pax_map(pax, data)
        name = real_name or name
        member = Member(name, rebuild(regions, real, stored, name, url, offset), offset)
    except (ValueError, KeyError, FormatError) as exc:
        yield from recovery.member_lost(_sparse_error(exc, name, url, offset), split_name(name)[0])
        return
    yield member


def _sparse_error(exc: Exception, name: str, url: str, offset: int) -> FormatError:
    if isinstance(exc, FormatError):
        return exc
    return FormatError(f"sparse member {name!r} cannot be rebuilt: {exc}", url=url, offset=offset)


def _not_tar(blocks: Blocks, url: str) -> FormatError:
    """The error for a stream whose first block is not a tar header (naming its compression)."""
    inside = f" ({blocks.compression}-compressed data, but not a tar inside)" if blocks.compression else ""
    return FormatError(f"not a tar archive (no valid tar header at the start){inside}", url=url, offset=0)


def _metadata(typeflag: bytes, data: bytes, carried: Carried, url: str, offset: int) -> Carried:
    """The (long name, pax records) the next member is read with after a metadata entry; FormatError
    when they are malformed (an empty long name: its data was zeroed) or repeated (no writer puts two
    before one member: the member the first one described lost its header)."""
    long_name, pax = carried
    if typeflag == b"L":
        name = cstring(data).decode("utf-8", "surrogateescape")
        if not name or long_name is not None:
            raise FormatError("empty GNU long name, or two in a row", url=url, offset=offset)
        return name, pax
    if typeflag == b"x":
        if pax:  # the member the first one described is missing (its header lost)
            raise FormatError("two pax headers in a row", url=url, offset=offset)
        return long_name, pax_records(data, url, offset)
    return long_name, pax  # K and g carry nothing a regular file needs


def _truncated_member(name: str, size: int, got: int, url: str, offset: int, typeflag: bytes = b"0") -> FormatError:
    """The error for a member whose data (or its block padding) the stream ended inside; it names
    the member's key when the member is a regular file (a pax/long-name entry's name is not one)."""
    missing = f"got {got}" if got < size else "block padding missing"
    key = split_name(name)[0] if typeflag in REGULAR else None
    error = FormatError(f"truncated tar: member {name!r} needs {size} bytes, {missing}",
                        url=url, key=key, offset=offset)
    error.next_key = key  # type: ignore[attr-defined]
    return error
