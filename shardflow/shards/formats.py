"""Shard names and compressions, in one place: which suffixes name a shard, which compression a tar
shard's name asks for, which names shardflow refuses to write, and the magic bytes a reader sniffs.

Why one owner: the writer (which compression stage a name gets), the job's naming (`{name}` drops the
suffix), the guard (which files beside the outputs are shards) and the plan (a name refused before a
run starts) all read this table. When they kept lists of their own, a `.tar.xz` output was written as
a plain tar under that name.

Levels are those of the command-line tools (gzip 6, bzip2 9, xz 6, zstd 3), so a shard is about the
size the user would get by compressing the tar by hand. Every compressor here is deterministic (no
timestamp, no thread-dependent framing): identical samples give byte-identical shards.
zstd needs the `zstandard` package (the optional extra `zstd`); without it a `.tar.zst` output is
refused when the name is checked (the plan, or the writer's constructor) and a zstd input is a
one-line error naming the shard and the extra.
"""

from __future__ import annotations

import bz2
import functools
import lzma
import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from shardflow.shards.records import RECORD_SUFFIXES

ZSTD_EXTRA = "zstd"  # pip install 'shardflow[zstd]' brings the zstandard package


@dataclass(frozen=True)
class Compression:
    """One compression a tar shard can be stored with."""

    name: str  # 'gzip', 'bzip2', 'xz', 'zstd': what errors and ShardInfo-adjacent messages say
    magic: bytes  # the first bytes of every stream of it (sniffed on read, never trusted from the name)
    suffixes: tuple[str, ...]  # tar shard names that ask for it (lower case), the usual one first
    bare: str  # the compressor's own suffix: `x.gz` is gzipped too (as before there was a table)
    compressor: Callable[[], Any]  # a fresh object with compress(bytes) -> bytes and flush() -> bytes
    package: str = ""  # the PyPI package it needs ('' = the standard library)


def _zstd_compressor() -> Any:
    import zstandard  # the extra: checked by output_compression before any writer asks for one

    # a checksum per frame, so damage inside is found on read; one thread, so the framing is fixed
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()


COMPRESSIONS: tuple[Compression, ...] = (
    Compression("gzip", b"\x1f\x8b", (".tar.gz", ".tgz"), ".gz", lambda: zlib.compressobj(6, zlib.DEFLATED, 31)),
    Compression("bzip2", b"BZh", (".tar.bz2", ".tbz2", ".tbz"), ".bz2", lambda: bz2.BZ2Compressor(9)),
    Compression("xz", b"\xfd7zXZ\x00", (".tar.xz", ".txz"), ".xz", lambda: lzma.LZMACompressor(preset=6)),
    Compression("zstd", b"\x28\xb5\x2f\xfd", (".tar.zst", ".tzst"), ".zst", _zstd_compressor, package="zstandard"),
)
BY_NAME = {c.name: c for c in COMPRESSIONS}

# Every suffix that names a shard (tar, compressed tar, record stream), longest first so `.tar.gz`
# wins over `.tar`'s neighbours when a stem is cut.
TAR_SUFFIXES: tuple[str, ...] = (".tar", *(s for c in COMPRESSIONS for s in c.suffixes))
SHARD_SUFFIXES: tuple[str, ...] = tuple(sorted((*TAR_SUFFIXES, *RECORD_SUFFIXES), key=len, reverse=True))

_WRITES = ", ".join([".tar", *("/".join(c.suffixes) for c in COMPRESSIONS)])
# A compression named after `.tar` (`.tar.lz4`, `.tar.Z`, `.tar.zstd`): not a number, which split
# archives use (`.tar.001`). Plus the short forms and bare suffixes of compressors shardflow lacks.
_TAR_THEN = re.compile(r"\.tar(\.[a-z0-9_]*[a-z_][a-z0-9_]*)$")
_CANNOT = (".tlz", ".tlz4", ".taz", ".tz2", ".tzo", ".lz", ".lz4", ".lzma", ".lzo", ".z", ".br", ".sz")


class UnwritableName(ValueError):
    """An output name asks for a compression shardflow cannot write (here): refused before writing."""


def sniff(head: bytes) -> str | None:
    """The compression of a stream starting with `head` ('gzip', 'bzip2', 'xz', 'zstd'), None if plain."""
    for compression in COMPRESSIONS:
        if head.startswith(compression.magic):
            return compression.name
    return None


def _path(url: str) -> str:
    return url.split("?", 1)[0].lower()


def output_compression(url: str) -> str:
    """The compression a shard written under `url` gets ('' for a plain tar); raises UnwritableName
    (one line naming the output) for a compression shardflow cannot write, or whose package is missing."""
    path = _path(url)
    if path.endswith(".tar"):  # the common case, first
        return ""
    for compression in COMPRESSIONS:
        if path.endswith(compression.suffixes) or path.endswith(compression.bare):
            if compression.package and not _importable(compression.package):
                raise UnwritableName(
                    f"output {url!r} is {compression.name}-compressed, which needs the {compression.package!r} "
                    f"package (not importable here): pip install 'shardflow[{ZSTD_EXTRA}]', or name it .tar")
            return compression.name
    match = _TAR_THEN.search(path)
    cannot = ".tar" + match.group(1) if match else next((s for s in _CANNOT if path.endswith(s)), None)
    if cannot is not None:
        cannot = url.split("?", 1)[0][-len(cannot):]  # as the user wrote it (`.tar.Z`)
        raise UnwritableName(f"output {url!r}: shardflow cannot write {cannot!r} shards (it writes {_WRITES}); "
                             "name it with one of these (a plain tar is never written under that name)")
    return ""


def check_output_name(url: str) -> None:
    """Refuse (UnwritableName) an output name shardflow cannot write as it says; see output_compression."""
    output_compression(url)


def shard_stem(url: str) -> str:
    """Basename of a shard without its shard suffix: `s3://b/train-000003.tar.gz` -> `train-000003`."""
    base = url.rstrip("/").rsplit("/", 1)[-1]
    lower = base.lower()
    for suffix in SHARD_SUFFIXES:
        if lower.endswith(suffix):
            return base[: -len(suffix)]
    return base


def is_shard_name(base: str) -> bool:
    """Whether a file name ends with a shard suffix (tar, compressed tar or record stream)."""
    return base.lower().endswith(SHARD_SUFFIXES)


@functools.lru_cache(maxsize=None)
def _importable(package: str) -> bool:
    try:
        __import__(package)
    except ImportError:
        return False
    return True


def missing_package(compression: str) -> str | None:
    """The package reading or writing `compression` needs when it cannot be imported here, else None."""
    package = BY_NAME[compression].package
    return package if package and not _importable(package) else None
