"""Shard specs: turning what a user wrote into the ordered list of shard URLs it names.

A spec is a brace pattern (`x-{000000..000554}.tar`, several groups allowed), a glob on any fsspec
filesystem (`s3://b/train-*.tar`, one listing per pattern), a list of either, `-` for stdin/stdout
or a `pipe:CMD` URL (taken as it is). As in webdataset, `a::b` joins the lists of `a` and `b` (an
fsspec chain such as `simplecache::s3://b/k` stays one URL: a left side that is only a protocol
name is its first link), and `${VAR}` is replaced by the environment variable VAR (unset: an error).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Sequence

import braceexpand

from shardflow.errors import ShardIOError
from shardflow.storage.options import options_for
from shardflow.storage.paths import Options
from shardflow.storage.protocols import protocol_of_fs
from shardflow.storage.retry import describe

Spec = str | Sequence[str]

GLOB_CHARS = frozenset("*?[")
_NUMERIC_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?\}")


def expand(spec: Spec, storage_options: Options = None) -> list[str]:
    """Turn a spec into the ordered list of shard URLs it names.

    Brace groups expand in order; patterns with glob characters are listed once each and sorted.
    A spec with no shards is an error: an empty run is almost always a typo.
    """
    urls: list[str] = []
    for part in spec_parts(spec):
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


def spec_parts(spec: Spec) -> list[str]:
    """The pieces of a spec as expand() reads them: lists and `a::b` joins split, `${VAR}` expanded
    (pipe: commands and `-` left as written: their `${...}` is the shell's)."""
    parts = [p for part in ([spec] if isinstance(spec, str) else list(spec)) for p in split_joined(part)]
    return [p if p == "-" or p.startswith("pipe:") else expand_vars(p) for p in parts]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(spec: str) -> str:
    """`spec` with every `${VAR}` replaced by the environment variable VAR; unset is an error."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ShardIOError(f"spec {spec!r} uses ${{{name}}}, but the environment variable {name} is not set")
        return os.environ[name]

    return _VAR.sub(value, spec) if "${" in spec else spec


def _is_protocol(name: str) -> bool:
    """Whether `name` is an fsspec protocol (the first links of a chained URL)."""
    from fsspec.registry import known_implementations, registry

    return name in known_implementations or name in registry


def split_joined(spec: str) -> list[str]:
    """`a::b` -> [a, b] (webdataset's join of spec lists); fsspec chains (`simplecache::s3://b/k`) and
    `pipe:` commands stay whole."""
    if "::" not in spec or spec.startswith("pipe:"):
        return [spec]
    out: list[str] = []
    link = ""  # protocol names of an fsspec chain waiting for their URL
    for piece in spec.split("::"):
        if _is_protocol(piece):
            link += piece + "::"
            continue
        out.append(link + piece)
        link = ""
    if link:
        out.append(link[:-2])
    return [p for p in out if p]


def count(spec: Spec, storage_options: Options = None) -> int:
    """len(expand(spec)) without holding the URLs (brace ranges are counted, globs listed once each)."""
    total = 0
    for part in spec_parts(spec):
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
    except PermissionError as exc:  # wrong or missing credentials: say so, not "matched no shards"
        raise ShardIOError(f"access denied listing the glob (check the credentials: --storage-option, AWS_* / "
                           f"GOOGLE_* environment): {describe(exc, options)}", url=pattern) from exc
    except (OSError, ValueError) as exc:
        raise ShardIOError(f"cannot list: {describe(exc, options)}", url=pattern) from exc
    if not _basename(pattern).startswith("."):
        # like a shell: `*` does not match hidden names (writer temps `.x.tar.tmp-...`, markers)
        matches = [m for m in matches if not _basename(m).startswith(".")]
    if not matches:
        raise ShardIOError(f"glob {pattern!r} matched no shards{_access_hint(fs, path)}")
    if "://" not in pattern:
        return matches
    return [fs.unstrip_protocol(m) for m in matches]


def _access_hint(fs: Any, path: str) -> str:
    """Why a listing may have come back empty: some stores answer a denied listing with nothing, so
    ask for the folder itself; '' when access looks fine (or the store cannot say)."""
    folder = path[: min(path.index(c) for c in GLOB_CHARS if c in path)].rpartition("/")[0]
    try:
        fs.info(folder)
    except PermissionError as exc:
        return f" because access was denied (check the credentials): {type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - missing folder, or a store without folders: nothing to add
        return ""
    return ""


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
    prefix_listing = protocol_of_fs(fs).listing_by_prefix  # one request per page of matching keys
    if not prefix_listing or "/" in tail or "**" in tail or "/" not in literal:
        _invalidate(fs)
        return [m for m in fs.glob(path) if not m.endswith("/")]  # "x/": a directory marker
    root, _, base = literal.rpartition("/")
    _invalidate(fs, root)
    names = fs.find(root, maxdepth=1, withdirs=False, prefix=base)
    regex = re.compile(glob_translate(path))
    return [n for n in names if regex.match(n)]

