"""Shard specs: turning what a user wrote into the ordered list of shard URLs it names.

A spec is a brace pattern (`x-{000000..000554}.tar`, several groups allowed), a glob on any fsspec
filesystem (`s3://b/train-*.tar`, one listing per pattern), a list of either, `-` for stdin/stdout
or a `pipe:CMD` URL (taken as it is).
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import braceexpand

from shardflow.errors import ShardIOError
from shardflow.storage.options import options_for
from shardflow.storage.paths import Options, fs_protocols
from shardflow.storage.retry import describe

Spec = str | Sequence[str]

GLOB_CHARS = frozenset("*?[")
_NUMERIC_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?\}")
# Stores that list by key prefix server-side (s3fs / gcsfs `find(prefix=...)`): one request per page
# of matching keys instead of a listing of the whole folder.
PREFIX_LISTING_PROTOCOLS = frozenset({"gcs", "gs", "s3", "s3a"})


def expand(spec: Spec, storage_options: Options = None) -> list[str]:
    """Turn a spec into the ordered list of shard URLs it names.

    Brace groups expand in order; patterns with glob characters are listed once each and sorted.
    A spec with no shards is an error: an empty run is almost always a typo.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    for part in parts:
        if part == "-" or part.startswith("pipe:"):
            urls.append(part)
            continue
        for url in braceexpand.braceexpand(part):
            if GLOB_CHARS & set(_path_part(url)):
                urls.extend(_glob(url, storage_options))
            else:
                urls.append(url)
    if not urls:
        raise ShardIOError(f"spec {spec!r} names no shards")
    return urls


def count(spec: Spec, storage_options: Options = None) -> int:
    """len(expand(spec)) without holding the URLs (brace ranges are counted, globs listed once each)."""
    total = 0
    for part in [spec] if isinstance(spec, str) else list(spec):
        if part == "-" or part.startswith("pipe:"):
            total += 1
            continue
        ranges = numeric_ranges(part)
        if ranges is not None:  # x-{000000..999999}.tar: counted, not expanded (braceexpand: ~5 us a name)
            total += math.prod(ranges)
            continue
        for url in braceexpand.braceexpand(part):
            total += len(_glob(url, storage_options)) if GLOB_CHARS & set(_path_part(url)) else 1
    if not total:
        raise ShardIOError(f"spec {spec!r} names no shards")
    return total


def numeric_ranges(part: str) -> list[int] | None:
    """Sizes of the brace groups of `part` when every one is a plain numeric range ({a..b} or
    {a..b..step}) and nothing else could expand (no other brace, escape or glob character)."""
    sizes = []
    for a, b, step in _NUMERIC_RANGE.findall(part):
        sizes.append(-(-(abs(int(b) - int(a)) + 1) // max(1, abs(int(step or 1)))))
    rest = _NUMERIC_RANGE.sub("", part)
    if set("{}\\") & set(rest) or GLOB_CHARS & set(_path_part(rest)):
        return None
    return sizes


def _path_part(url: str) -> str:
    """The part of a URL that can hold glob characters (not the scheme or query)."""
    return url.split("://", 1)[-1]


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _glob(pattern: str, storage_options: Options) -> list[str]:
    """Shards matching one glob pattern, with one listing (paged) of the store."""
    import fsspec.core

    options = options_for(pattern, storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(pattern, **options)
        matches = sorted(_list_matches(fs, path))
    except FileNotFoundError:
        matches = []
    except (OSError, ValueError) as exc:
        raise ShardIOError(f"cannot list: {describe(exc, options)}", url=pattern) from exc
    if not _basename(pattern).startswith("."):
        # like a shell: `*` does not match hidden names (writer temps `.x.tar.tmp-...`, markers)
        matches = [m for m in matches if not _basename(m).startswith(".")]
    if not matches:
        raise ShardIOError(f"glob {pattern!r} matched no shards")
    if "://" not in pattern:
        return matches
    return [fs.unstrip_protocol(m) for m in matches]


def _invalidate(fs: Any, *path: str) -> None:
    """Forget cached listings: a spec must see the shards written a moment ago."""
    try:
        fs.invalidate_cache(*path)
    except Exception:  # noqa: BLE001 - a stale cache is the worst outcome
        pass


def _list_matches(fs: Any, path: str) -> list[str]:
    """Paths matching the glob `path`.

    On object stores a single-level pattern (`s3://b/dir/train-*.tar`) lists only the keys that
    start with its literal part (`dir/train-`), server-side, instead of the whole bucket.
    """
    from fsspec.utils import glob_translate

    first = min(path.index(c) for c in GLOB_CHARS if c in path)
    literal, tail = path[:first], path[first:]
    prefix_listing = bool(PREFIX_LISTING_PROTOCOLS.intersection(fs_protocols(fs)))
    if not prefix_listing or "/" in tail or "**" in tail or "/" not in literal:
        _invalidate(fs)
        return [m for m in fs.glob(path) if not m.endswith("/")]  # "x/": a directory marker
    root, _, base = literal.rpartition("/")
    _invalidate(fs, root)
    names = fs.find(root, maxdepth=1, withdirs=False, prefix=base)
    regex = re.compile(glob_translate(path))
    return [n for n in names if regex.match(n)]

