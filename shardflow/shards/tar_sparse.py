"""Sparse members (`tar --sparse`): rebuilt to their real bytes, as tarfile (and so webdataset) does.

A sparse member stores only its data regions plus a map of (offset, length) pairs; the holes read
as zeros. GNU tar writes them as typeflag 'S' (old GNU format: the map in the header and in
extension blocks) or, in pax format, as a regular member named `./GNUSparseFile.N/<name>` with
`GNU.sparse.*` records (version 0.1: the map in a record; 1.0: the map at the start of the data).
Version 0.0 (repeated offset/numbytes records) is refused with a clear error. Without this the GNU
member was dropped silently and the pax one read under a bogus key with the wrong bytes.

The map is checked (regions in order, inside the real size, adding up to the stored bytes) and the
real size is bounded by SPARSE_LIMIT: a header cannot make the reader allocate what it claims.
"""

from __future__ import annotations

from shardflow.errors import FormatError
from shardflow.shards.tar_headers import BLOCK, parse_number

SPARSE_LIMIT = 256 << 20  # the largest real size a sparse member is rebuilt to (holes included)

Regions = list[tuple[int, int]]


def is_pax_sparse(pax: dict[str, str]) -> bool:
    """Whether pax records describe a GNU sparse member."""
    return any(key.startswith("GNU.sparse.") for key in pax)


def gnu_map(header: bytes, extensions: list[bytes]) -> tuple[Regions, int]:
    """(regions, real size) of an old-GNU 'S' header and its extension blocks."""
    regions = _entries(header[386:482], 4)
    for block in extensions:
        regions += _entries(block[:504], 21)
    return regions, parse_number(header[483:495])


def gnu_extended(block: bytes) -> bool:
    """Whether another extension block follows (the header's byte 482, an extension's byte 504)."""
    return block[0] != 0


def _entries(field: bytes, count: int) -> Regions:
    out = []
    for i in range(count):
        entry = field[24 * i : 24 * i + 24]
        if not entry.strip(b"\0"):
            break
        out.append((parse_number(entry[:12]), parse_number(entry[12:24])))
    return out


def pax_map(pax: dict[str, str], data: bytes) -> tuple[Regions, int, bytes, str]:
    """(regions, real size, stored bytes, real name) of a pax sparse member; ValueError if unusable."""
    major = pax.get("GNU.sparse.major")
    if major == "1":
        numbers, used = _data_map(data)
        regions = list(zip(numbers[1::2], numbers[2::2]))
        if len(regions) != numbers[0]:
            raise ValueError("sparse map count does not match its entries")
        real = int(pax["GNU.sparse.realsize"])
        return regions, real, data[used:], pax.get("GNU.sparse.name", "")
    if "GNU.sparse.map" in pax:  # version 0.1
        numbers = [int(x) for x in pax["GNU.sparse.map"].split(",")]
        if len(numbers) % 2:
            raise ValueError("odd number of values in GNU.sparse.map")
        regions = list(zip(numbers[0::2], numbers[1::2]))
        return regions, int(pax["GNU.sparse.size"]), data, pax.get("GNU.sparse.name", "")
    raise ValueError("unsupported GNU sparse format (version 0.0); recreate it with --sparse-version=1.0")


def _data_map(data: bytes) -> tuple[list[int], int]:
    """The decimal numbers (count, then offset/length pairs) at the start of a 1.0 member's data,
    and how many bytes (whole blocks) they take."""
    first = data.find(b"\n")
    if first < 0:
        raise ValueError("no sparse map at the start of the data")
    count = int(data[:first])
    if count < 0 or count > len(data):
        raise ValueError("bad sparse map count")
    lines = data.split(b"\n", 2 * count + 1)
    if len(lines) < 2 * count + 2:
        raise ValueError("sparse map is cut short")
    numbers = [int(x) for x in lines[: 2 * count + 1]]
    used = sum(len(x) + 1 for x in lines[: 2 * count + 1])
    return numbers, used + (-used % BLOCK)


def rebuild(regions: Regions, real: int, stored: bytes, name: str, url: str, offset: int) -> bytes:
    """The real bytes of a sparse member: its stored regions placed at their offsets, zeros between."""
    where = f"sparse member {name!r}"
    if not 0 <= real <= SPARSE_LIMIT:
        raise FormatError(f"{where} would expand to {real} bytes (more than {SPARSE_LIMIT})", url=url, offset=offset)
    out = bytearray(real)
    pos = end = 0
    for start, length in regions:
        if start < end or length < 0 or start + length > real or pos + length > len(stored):
            raise FormatError(f"{where}: bad sparse map (regions out of order or outside the file)",
                              url=url, offset=offset)
        out[start : start + length] = stored[pos : pos + length]
        pos, end = pos + length, start + length
    if pos != len(stored):
        raise FormatError(f"{where}: sparse map covers {pos} of {len(stored)} stored bytes", url=url, offset=offset)
    return bytes(out)
