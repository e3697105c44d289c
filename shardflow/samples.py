"""Group tar members into samples and split samples back into members.

Key rule (webdataset's): the key is the member path up to the first dot of its basename, the
extension is the rest, lower-cased. `a.b/c/000123.seg.png` -> key `a.b/c/000123`, ext `seg.png`.
Members of a sample are adjacent in the tar. Real data breaks these rules (a key that reappears later,
two members with the same extension, names with no extension); each case is reported as a
SampleError instead of being merged or dropped silently.
"""

from __future__ import annotations

import warnings
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from .errors import SampleError, ShardflowError
from .tario import Corruption, Member, iter_members

Sample = dict[str, Any]
ErrorSink = Callable[[ShardflowError], None]

ON_ERROR = ("raise", "skip", "warn")


class ShardflowWarning(UserWarning):
    """Issued for each skipped problem when on_error="warn"."""


def split_name(name: str) -> tuple[str, str]:
    """Split a member path into (key, extension); extension is '' when the basename has no dot.

    This gives webdataset's split for every name webdataset gives a key to. A basename that starts
    with '.' (a hidden file) gives a key that is empty or ends with '/': iter_samples reports those.
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


def check_key(key: Any) -> str | None:
    """Why a sample key cannot be written so that it reads back identically (None when it can)."""
    if not isinstance(key, str) or not key:
        return f"sample key must be a non-empty str, got {key!r}"
    base = key[key.rfind("/") + 1 :]
    if not base:
        return f"sample key {key!r} ends with '/'"
    if "." in base:
        return f"sample key {key!r} has a '.' in its last path part, so it would split differently when read back"
    if key.startswith("/") or ".." in key.split("/"):
        return f"sample key {key!r} is an absolute path or contains '..'"
    if "\0" in key:
        return f"sample key {key!r} contains a NUL character, which tar headers cannot hold"
    return None


def iter_samples(
    members: Iterable[Member | Corruption],
    url: str = "",
    *,
    on_error: str = "raise",
    report: ErrorSink | None = None,
) -> Iterator[Sample]:
    """Group adjacent members into sample dicts.

    `on_error="raise"` raises the first SampleError/FormatError. Otherwise each problem goes to
    `report` (`"warn"` also issues a Python warning) and the offending piece is left out: the second
    member with an extension the sample already has, the members of a key that reappears later in
    the shard, members with no extension, and every sample that archive damage may have cut.

    Around damage (a Corruption from `iter_members(..., resync=True)`), the sample before it and the
    sample after it are delivered only when they are known to be whole: the damaged member's name
    (the Corruption's hint) names another sample, or, when the shard's samples so far all had the
    same set of extensions, the neighbour has exactly that set. Otherwise they are left out and
    reported: a partial sample is never delivered as if it were good.
    A FormatError that ends the stream (truncation, corrupt gzip) is raised in every mode, after the
    samples known to be complete; the sample in progress is not yielded, and the error names its key.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")

    def problem(error: ShardflowError) -> None:
        if on_error == "raise":
            raise error
        if on_error == "warn":
            warnings.warn(str(error), ShardflowWarning, stacklevel=3)
        if report is not None:
            report(error)

    seen: set[str] = set()
    current: Sample | None = None
    current_hints: list[str | None] = []  # damage just before `current` (None: unknown member)
    skipping: str | None = None  # a key whose members are being left out
    pending: Sample | None = None  # the sample in progress when damage was found, undecided
    pending_hints: list[str | None] = []
    next_hints: list[str | None] = []  # damage the next new sample follows
    common: frozenset[str] | None = None  # extension set shared by every clean sample so far
    uniform = True

    def whole(sample: Sample, hints: list[str | None]) -> bool:
        """Is a sample next to damage known to be complete?"""
        keys = {None if h is None else split_name(h)[0] for h in hints}
        if sample["__key__"] in keys:
            return False
        if common is not None and uniform:
            return _exts(sample) == common
        return None not in keys

    def settle(sample: Sample, hints: list[str | None]) -> Sample | None:
        if whole(sample, hints):
            return sample
        problem(SampleError("sample left out: next to archive damage, it may be incomplete", url=url, key=sample["__key__"]))
        return None

    it = iter(members)
    while True:
        try:
            member = next(it)
        except StopIteration:
            break
        except ShardflowError as exc:
            raise _located(exc, current if current is not None else pending) from exc.__cause__
        if isinstance(member, Corruption):
            problem(member.error)
            if current is not None:
                if current_hints:  # damage on both sides
                    pending_hints = current_hints
                else:
                    pending_hints = []
                pending, current, current_hints = current, None, []
            pending_hints.append(member.hint)
            next_hints.append(member.hint)
            skipping = None
            continue
        key, ext = split_name(member.name)
        if pending is not None:
            if key == pending["__key__"]:  # the damaged sample goes on after the damage
                problem(SampleError("sample left out: archive damaged inside it", url=url, key=key))
                pending, pending_hints, next_hints, skipping = None, [], [], key
                continue
            done = settle(pending, pending_hints)
            pending, pending_hints = None, []
            if done is not None:
                yield done
        if not ext:
            problem(SampleError(f"member {member.name!r} has no extension (no '.' in its name)", url=url, key=key, offset=member.offset))
            continue
        if not key or key[-1] == "/":
            problem(SampleError(
                f"member {member.name!r} is a hidden file (its name starts with '.'), so it has no sample key",
                url=url, key=key or None, offset=member.offset,
            ))
            continue
        if current is not None and key == current["__key__"]:
            if ext in current:
                problem(SampleError(f"duplicate extension {ext!r} in sample", url=url, key=key, offset=member.offset))
                continue
            current[ext] = member.data
            continue
        if key == skipping:
            continue
        if current is not None:
            if current_hints:
                done = settle(current, current_hints)
                if done is not None:
                    yield done
            else:
                if common is None:
                    common = _exts(current)
                elif uniform and _exts(current) != common:
                    uniform = False
                yield current
            current, current_hints = None, []
        if key in seen:
            problem(SampleError("key reappears later in the shard (members of a sample must be adjacent)", url=url, key=key, offset=member.offset))
            skipping = key
            next_hints = []
            continue
        seen.add(key)
        skipping = None
        current = {"__key__": key, "__url__": url, ext: member.data}
        current_hints, next_hints = next_hints, []
    if pending is not None:
        done = settle(pending, pending_hints)
        if done is not None:
            yield done
    if current is not None:
        if current_hints:
            done = settle(current, current_hints)
            if done is not None:
                yield done
        else:
            yield current


def _exts(sample: Sample) -> frozenset[str]:
    return frozenset(k for k in sample if not k.startswith("__"))


def _located(exc: ShardflowError, sample: Sample | None) -> ShardflowError:
    """`exc` naming the key of the sample in progress when it does not name one already."""
    if exc.key is not None or sample is None:
        return exc
    return exc.with_location(key=sample["__key__"])


def read_samples(
    source: BinaryIO | str,
    url: str = "",
    *,
    on_error: str = "raise",
    report: ErrorSink | None = None,
    storage_options: dict[str, Any] | None = None,
    allow_pipe: bool | None = None,
) -> Iterator[Sample]:
    """Samples of one shard: an open binary stream, or a URL that is opened (and closed) here.

    With on_error != 'raise' damage is reported and skipped (see iter_samples). A format error that
    cannot be skipped (truncation, corrupt gzip) still ends the shard: it is raised after every
    sample known to be complete was yielded; the sample in progress is not. When given a URL the
    stream is closed when the iterator is exhausted or closed, so a `pipe:` command is reaped (and
    its failure raised as PipeError) even when the caller stops early.
    """
    if isinstance(source, str):
        return _read_url(source, on_error, report, storage_options, allow_pipe)
    members = iter_members(source, url, resync=on_error != "raise")
    return iter_samples(members, url, on_error=on_error, report=report)


def _read_url(url, on_error, report, storage_options, allow_pipe) -> Iterator[Sample]:
    from . import urls  # urls imports fsspec: keep it off the import path of tar-only users

    stream = urls.open_read(url, storage_options, allow_pipe=allow_pipe)
    try:
        yield from iter_samples(iter_members(stream, url, resync=on_error != "raise"), url, on_error=on_error, report=report)
    finally:
        stream.close()


def sample_members(sample: Sample) -> list[tuple[str, bytes]]:
    """(name, bytes) members of an encoded sample, extensions sorted so output is reproducible."""
    key = sample.get("__key__")
    why = check_key(key)
    if why:
        raise SampleError(why, key=key if isinstance(key, str) else None)
    members = []
    for ext in sorted(sample):
        if ext.startswith("__"):
            continue
        value = sample[ext]
        if not ext or "/" in ext or ext.startswith(".") or "\0" in ext:
            raise SampleError(f"bad extension {ext!r}", key=key)
        if ext != ext.lower():
            raise SampleError(
                f"extension {ext!r} is not lower-case: it would read back as {ext.lower()!r}", key=key
            )
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SampleError(f"value for {ext!r} is {type(value).__name__}, not bytes (encode it first)", key=key)
        members.append((f"{key}.{ext}", bytes(value)))
    if not members:
        raise SampleError("sample has no data entries (only __ metadata)", key=key)
    return members
