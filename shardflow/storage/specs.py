"""Shard specs: turning what a user wrote into the ordered list of shard URLs it names.

A spec is a brace pattern (`x-{000000..000554}.tar`, several groups allowed), a glob on any fsspec
filesystem (`s3://b/train-*.tar`, one listing per pattern), a list of either, `-` for stdin/stdout
or a `pipe:CMD` URL (taken as it is). As in webdataset, `a::b` joins the lists of `a` and `b` (an
fsspec chain such as `simplecache::s3://b/k` stays one URL: a left side that is only a protocol
name is its first link), and `${VAR}` is replaced by the environment variable VAR (unset: an error).

Hostile specs. `${VAR}` is expanded only where the caller says the text is the user's own (the command
line, the user's top-level spec, code): an included or remote dataset spec passes `variables=` as the
allow-list (shards/spec.py), so a stranger's spec cannot send `${AWS_SECRET_ACCESS_KEY}` to its host.
An error never shows an expanded value: messages print the part as written, `${VAR}` and all. Brace
groups are counted before they are expanded (a spec naming more than MAX_URLS shards is refused, not
built in memory), unbalanced or too deeply nested braces are an error naming the part.
"""

from __future__ import annotations

import math
import os
import re
from typing import AbstractSet, Any, Iterator, Sequence

import braceexpand

from shardflow.errors import ShardflowError, ShardIOError
from shardflow.storage.options import options_for
from shardflow.storage.paths import Options
from shardflow.storage.protocols import protocol_of_fs
from shardflow.storage.retry import describe

Spec = str | Sequence[str]
Variables = bool | AbstractSet[str]  # True: any ${VAR}; a set: only these names; False (empty set): none

MAX_URLS = 10_000_000  # shards one spec may name when expanded (~1 GB of URL strings); count() is not bound
MAX_NESTING = 32  # brace groups inside brace groups

GLOB_CHARS = frozenset("*?[")
_NUMERIC_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?\}")


def expand(spec: Spec, storage_options: Options = None, *, variables: Variables = True) -> list[str]:
    """Turn a spec into the ordered list of shard URLs it names.

    Brace groups expand in order; patterns with glob characters are listed once each and sorted.
    A spec with no shards is an error: an empty run is almost always a typo. `variables`: which
    `${VAR}` may be expanded (see the module docstring); more than MAX_URLS shards is an error.
    """
    urls: list[str] = []
    for written, part in _parts(spec, variables):
        if part == "-" or part.startswith("pipe:"):
            urls.append(part)
            continue
        with _shown_as_written(written, part):
            if brace_count(part) > MAX_URLS - len(urls):
                raise ShardIOError(f"spec part {written!r} names more than {MAX_URLS:,} shards; "
                                   "split the dataset into several specs")
            for url in _brace_names(part, written):
                if GLOB_CHARS & set(_path_part(url)):
                    urls.extend(_glob(url, storage_options))
                else:
                    urls.append(url)
                if len(urls) > MAX_URLS:  # globs may list more than the count said
                    raise ShardIOError(f"spec part {written!r} names more than {MAX_URLS:,} shards")
    if not urls:
        raise ShardIOError(f"spec {_written(spec)!r} names no shards")
    return urls


def spec_parts(spec: Spec, variables: Variables = True) -> list[str]:
    """The pieces of a spec as expand() reads them: lists and `a::b` joins split, `${VAR}` expanded
    (pipe: commands and `-` left as written: their `${...}` is the shell's)."""
    return [part for _, part in _parts(spec, variables)]


def _parts(spec: Spec, variables: Variables) -> list[tuple[str, str]]:
    """(the piece as written, the piece with its variables expanded) of each piece of `spec`."""
    parts = [p for part in ([spec] if isinstance(spec, str) else list(spec)) for p in split_joined(part)]
    return [(p, p if p == "-" or p.startswith("pipe:") else expand_vars(p, variables)) for p in parts]


def _written(spec: Spec) -> str:
    return spec if isinstance(spec, str) else ", ".join(map(str, spec))


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(spec: str, variables: Variables = True) -> str:
    """`spec` with every `${VAR}` replaced by the environment variable VAR; unset is an error, and so
    is a name `variables` does not allow (False or a set without it)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if variables is not True and (variables is False or name not in variables):
            raise ShardIOError(f"spec {spec!r} uses ${{{name}}}, but variables expand only in your own "
                               "specs (the command line, your top-level spec, code), not in an included "
                               f"or remote spec; allow it with {ALLOW_ENV}={name}")
        if name not in os.environ:
            raise ShardIOError(f"spec {spec!r} uses ${{{name}}}, but the environment variable {name} is not set")
        return os.environ[name]

    return _VAR.sub(value, spec) if "${" in spec else spec


ALLOW_ENV = "SHARDFLOW_SPEC_VARS"  # names (comma-separated) that included and remote specs may use


def allowed_variables() -> frozenset[str]:
    """The variables an included or remote dataset spec may use: the user's explicit allow-list."""
    return frozenset(n.strip() for n in os.environ.get(ALLOW_ENV, "").split(",") if n.strip())


class _shown_as_written:
    """Errors raised while `expanded` is used show `written` instead: no expanded value is printed."""

    def __init__(self, written: str, expanded: str) -> None:
        self.pairs = _differences(written, expanded)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if not self.pairs or not isinstance(exc, ShardflowError):
            return False
        hide = lambda text: _unexpand(text, self.pairs)  # noqa: E731
        raise type(exc)(hide(exc.reason), url=None if exc.url is None else hide(exc.url), key=exc.key,
                        offset=exc.offset) from None


def _differences(written: str, expanded: str) -> list[tuple[str, str]]:
    """(value, `${NAME}`) of each variable of `written`, longest value first (values under 3 characters
    are left: replacing every `a` of a message would garble it, and they hide nothing)."""
    pairs = {os.environ.get(m.group(1), ""): m.group(0) for m in _VAR.finditer(written)} if written != expanded else {}
    return sorted(((v, n) for v, n in pairs.items() if len(v) >= 3), key=lambda p: -len(p[0]))


def _unexpand(text: str, pairs: list[tuple[str, str]]) -> str:
    for value, name in pairs:
        text = text.replace(value, name)
    return text


def _brace_names(part: str, written: str) -> Iterator[str]:
    """braceexpand(part), its unbalanced-brace error a ShardIOError naming the part as written."""
    try:
        yield from braceexpand.braceexpand(part)
    except braceexpand.UnbalancedBracesError:
        raise ShardIOError(f"spec part {written!r} has unbalanced braces") from None


def brace_count(part: str) -> int:
    """How many names braceexpand(part) yields, counted without expanding (an upper bound for
    literal groups such as `{x}` and unbalanced braces); more than MAX_NESTING levels is an error."""
    stack: list[list[int]] = []  # per open group: [start, alternatives so far, product of this one, commas]
    product = 1  # of the text outside any group
    i = 0
    while i < len(part):
        ch = part[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            if len(stack) >= MAX_NESTING:
                raise ShardIOError(f"spec part {part[:80]!r}... nests brace groups deeper than {MAX_NESTING}")
            stack.append([i, 0, 1, 0])
        elif ch == "," and stack:
            stack[-1][1] += stack[-1][2]
            stack[-1][2], stack[-1][3] = 1, 1
        elif ch == "}" and stack:
            start, alternatives, inner, commas = stack.pop()
            size = alternatives + inner if commas else _range_size(part[start:i + 1], inner)
            if stack:
                stack[-1][2] *= size
            else:
                product *= size
        i += 1
    while stack:  # unclosed groups: braceexpand refuses them; as an upper bound, count their alternatives
        _, alternatives, inner, _ = stack.pop()
        if stack:
            stack[-1][2] *= alternatives + inner
        else:
            product *= alternatives + inner
    return product


_ALPHA_RANGE = re.compile(r"\{([a-zA-Z])\.\.([a-zA-Z])(?:\.\.(-?\d+))?\}")


def _range_size(group: str, inner: int) -> int:
    """Names of a comma-less group: a numeric or letter range, else the group as it is (x inner)."""
    match = _NUMERIC_RANGE.fullmatch(group)
    if match is not None:
        a, b, step = match.groups()
        return -(-(abs(int(b) - int(a)) + 1) // max(1, abs(int(step or 1))))
    match = _ALPHA_RANGE.fullmatch(group)
    if match is not None:
        a, b, step = match.groups()
        return -(-(abs(ord(b) - ord(a)) + 1) // max(1, abs(int(step or 1))))
    return inner


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
    for written, part in _parts(spec, True):
        if part == "-" or part.startswith("pipe:"):
            total += 1
            continue
        with _shown_as_written(written, part):
            ranges = numeric_ranges(part)
            if ranges is not None:  # x-{000000..999999}.tar: counted, not expanded (braceexpand: ~5 us a name)
                total += math.prod(ranges)
                continue
            if brace_count(part) > MAX_URLS:
                raise ShardIOError(f"spec part {written!r} names more than {MAX_URLS:,} shards with brace "
                                   "groups other than numeric ranges; use ranges ({000..999}) or several specs")
            for url in _brace_names(part, written):
                total += len(_glob(url, storage_options)) if GLOB_CHARS & set(_path_part(url)) else 1
    if not total:
        raise ShardIOError(f"spec {_written(spec)!r} names no shards")
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
    except Exception as exc:  # noqa: BLE001 - a store client's own errors (botocore's NoCredentialsError) are
        # not OSErrors either: one line naming the glob, never a traceback
        hint = " (check the credentials: --storage-option, AWS_* / GOOGLE_* environment)" if (
            "credential" in type(exc).__name__.lower()) else ""
        raise ShardIOError(f"cannot list{hint}: {describe(exc, options)}", url=pattern) from exc
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

