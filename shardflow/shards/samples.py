"""Group tar members into samples and split samples back into members.

Members of a sample are adjacent in the tar and share a key (see keys.split_name). Real data breaks
these rules (a key that reappears later, two members with the same extension); each case is reported
as a SampleError instead of being merged or dropped silently. A member that belongs to no sample (no
extension, a hidden or macOS `._*` file) is left out and reported as a StrayMember, never raised.
What happens next to archive damage is decided by sample_recover.DamageGuard.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from shardflow.errors import (
    DEFAULT_ON_ERROR_READ,
    RAISE,
    WARN,
    SampleError,
    ShardflowError,
    ShardflowWarning,
    StrayMember,
    apply_policy,
    check_on_error,
)
from shardflow.shards.keys import Sample, check_ext, check_key, split_name
from shardflow.shards.records import read_records, record_format
from shardflow.shards.sample_recover import DamageGuard
from shardflow.shards.tar_read import Member, NotRegular, iter_members
from shardflow.shards.tar_recover import Corruption
from shardflow.storage.file_value import FileValue

ErrorSink = Callable[[ShardflowError], None]

__all__ = ["ErrorSink", "iter_samples", "read_samples", "sample_members", "strays_once"]


def iter_samples(members: Iterable[Member | NotRegular | Corruption], url: str = "", *,
                 on_error: str = DEFAULT_ON_ERROR_READ,
                 report: ErrorSink | None = None) -> Iterator[Sample]:
    """Group adjacent members into sample dicts.

    `on_error="raise"` raises the first SampleError/FormatError, after the samples known whole.
    Otherwise each problem goes to `report` (`"warn"` also warns) and the offending piece is left out: a
    second member with an extension the sample has, the members of a key that reappears later, and
    every sample archive damage may have cut (see sample_recover). A member that belongs to no sample
    (StrayMember: no extension, a hidden file) is left out in every mode: `report`ed, and warned about
    once per shard (see _stray). A FormatError that ends the stream (truncation, corrupt compression)
    is raised in every mode, after the samples known whole."""
    check_on_error(on_error)
    problem = functools.partial(apply_policy, on_error=on_error, report=report)  # warns at our caller
    nested = functools.partial(apply_policy, on_error=on_error, report=report, stacklevel=4)  # one call down
    guard = DamageGuard(url, nested)
    seen: dict[str, int] = {}  # key -> offset of its first member
    current: Sample | None = None
    # The sample before `current`, held back until a sound header follows the first member of
    # `current`: that member's header may be a displaced one standing where a member of the held
    # sample was (two headers swapped), which only the damage after it shows.
    held: Sample | None = None
    skipping: str | None = None  # a key whose members are being left out
    strays_told = False  # whether this shard's first stray member was warned about (once per shard)
    it = iter(members)
    while True:
        try:
            member = next(it)
        except StopIteration:
            break
        except ShardflowError as exc:
            if held is not None and _is_cut(exc):
                yield held  # a cut stream, not damage: the sample before the cut one is whole
            elif held is not None and on_error != RAISE:
                guard.held_back(held, exc.offset)
            held = None
            if current is not None and _ended_before(exc, current["__key__"]):
                yield current  # the member cut belongs to another sample: the one in progress is whole
                current = None
            if current is not None and exc.key not in (None, current["__key__"]) and on_error != RAISE:
                nested(SampleError("sample left out: the shard ends inside it", url=url, key=current["__key__"]))
            raise _located(exc, current) from exc.__cause__
        if type(member) is not Member:  # rare: one test on the per-member path, as before
            if type(member) is NotRegular:
                if on_error == RAISE:  # the samples whole before it first: a bad member costs only its own
                    yield from _whole(member.error.key, held, current)
                problem(member.error)  # a link or special file left out: said so, its neighbours kept
                continue
            lost = guard.damaged(member, current, seen)
            if held is not None and member.key is not None:
                yield held  # one member of a sample lost, its header sound: the framing before it held
            elif held is not None:
                guard.held_back(held, member.error.offset)
            held = None
            if lost is None and member.key is not None and current is not None:
                yield current  # one member of the next sample was lost: the current one is whole
            current, skipping = None, lost
            if lost is not None:
                seen.setdefault(lost, member.error.offset or 0)
            continue
        key, ext = split_name(member.name)
        keyless = not ext or not key or key[-1] == "/"
        if held is not None and not keyless:  # a sound header followed the first member of `current`
            yield held
            held = None
        if guard.active and guard.leave_out(member, key):
            seen.setdefault(key, member.offset)
            continue
        if keyless:  # belongs to no sample: left out and reported, not a failed sample (errors.StrayMember)
            strays_told = _stray(_keyless(member, key, ext, url), on_error, report, strays_told)
            if guard.orphan(member, current, held):  # a stand-in name: the samples next to it are left out
                skipping, current = (None, None) if current is None else (current["__key__"], None)
                if skipping is not None:
                    seen.setdefault(skipping, member.offset)
            elif held is not None:
                yield held
            held = None
            continue
        if current is not None and key == current["__key__"]:
            if ext in current:  # (the sample before it went out above: a sound header followed)
                problem(SampleError(f"duplicate extension {ext!r} in sample", url=url, key=key, offset=member.offset))
                continue
            current[ext] = member.data
            continue
        if key == skipping:
            continue
        if current is not None and guard.renamed(key, current, member.offset):  # both samples left out
            current, skipping = None, key
            seen.setdefault(key, member.offset)
            continue
        held = current
        if guard.displaced(key):
            current, skipping = None, key
            seen.setdefault(key, member.offset)
            continue
        try:
            current, skipping = _start(member, key, ext, url, seen, nested)
        except SampleError:  # raise: a key that reappears; the sample before it is whole (another key)
            if held is not None:
                yield held
            raise
    if held is not None:
        yield held
    if current is not None:
        yield current


def _start(member: Member, key: str, ext: str, url: str, seen: dict[str, int],
           problem: ErrorSink) -> tuple[Sample | None, str | None]:
    """(the new sample, None), or (None, key) for a key seen before: its members are left out."""
    first = seen.get(key)
    if first is not None:
        problem(SampleError(f"key reappears later in the shard (members of a sample must be adjacent): this part is "
                            f"left out, and the first part (offset {first}) may be incomplete",
                            url=url, key=key, offset=member.offset))
        return None, key
    seen[key] = member.offset
    return {"__key__": key, "__url__": url, ext: member.data}, None


def _whole(bad_key: str | None, *samples: Sample | None) -> Iterator[Sample]:
    """Under raise, before a bad member's error: the samples in hand that it is no part of (whole)."""
    for sample in samples:
        if sample is not None and sample["__key__"] != bad_key:
            yield sample


def _keyless(member: Member, key: str, ext: str, url: str) -> StrayMember:
    """The report of a member that cannot belong to a sample: no extension, or a hidden file."""
    if not ext:
        return StrayMember(f"member {member.name!r} has no extension (no '.' in its name): left out, it belongs "
                           "to no sample", url=url, key=key, offset=member.offset)
    return StrayMember(f"member {member.name!r} is a hidden file (its name starts with '.'), so it has no sample "
                       "key: left out, it belongs to no sample", url=url, key=key or None, offset=member.offset)


def _stray(error: StrayMember, on_error: str, report: ErrorSink | None, told: bool) -> bool:
    """Leave out a member that belongs to no sample, whatever `on_error` says (webdataset skips them
    silently; a macOS tar has one `._*` beside every file): never raised, its neighbours are whole.
    Each one goes to `report` (a job logs it in errors/, uncounted); the first of a shard is warned
    about when nobody is told otherwise (raise without `report`) or under warn. Returns `told`."""
    if report is not None:
        report(error)
    if not told and (on_error == WARN or (report is None and on_error == RAISE)):
        warnings.warn(f"{error} (further members of this shard that belong to no sample are left out without "
                      "a warning)", ShardflowWarning, stacklevel=3)
        return True
    return told


def strays_once(report: ErrorSink) -> ErrorSink:
    """`report` for one shard, for a tool that prints each problem: told of the shard's first stray member
    only (a macOS tar has a `._*` beside every file: one line, not thousands); the rest pass unchanged."""
    told = False

    def sink(error: ShardflowError) -> None:
        nonlocal told
        if type(error) is StrayMember:
            if told:
                return
            told = True
            error = StrayMember(f"{error.reason} (further members of this shard that belong to no sample are "
                                "left out without a warning)", url=error.url, key=error.key, offset=error.offset)
        report(error)

    return sink


def _is_cut(exc: ShardflowError) -> bool:
    """Whether `exc` is a stream cut short at a header or inside a member (not damage): then what
    was read before the cut is sound."""
    return hasattr(exc, "next_key") or hasattr(exc, "next_name")


def _ended_before(exc: ShardflowError, key: str) -> bool:
    """Whether a truncation cut a header whose (known) name belongs to a sample other than `key`
    (compared by basename: the ustar prefix may have been cut off)."""
    next_key = getattr(exc, "next_key", None)
    if next_key is not None:
        return next_key != key
    name = getattr(exc, "next_name", None)
    if name is None:
        return False
    return split_name(name)[0].rpartition("/")[2] != key.rpartition("/")[2]


def _located(exc: ShardflowError, sample: Sample | None) -> ShardflowError:
    """`exc` naming the key of the sample in progress when it does not name one already."""
    if exc.key is not None or sample is None:
        return exc
    return exc.with_location(key=sample["__key__"])


def read_samples(
    source: BinaryIO | str,
    url: str = "",
    *,
    on_error: str = DEFAULT_ON_ERROR_READ,
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

    Memory: a sample is yielded once the next one's first member was read and a sound header followed
    it, so the reader holds about two samples; a caller that lets go of each before asking for the
    next (as run_task does) keeps a shard of 10 MB samples at about 20 MB, one that keeps it, three.
    """
    if record_format(source if isinstance(source, str) else url):  # .cbors / .mps / .msgpacks
        return read_records(source, url, on_error=on_error, report=report, storage_options=storage_options,
                            allow_pipe=allow_pipe)
    if isinstance(source, str):
        return _read_url(source, on_error, report, storage_options, allow_pipe)
    members = iter_members(source, url, resync=on_error != "raise")
    return iter_samples(members, url, on_error=on_error, report=report)


def _read_url(url: str, on_error: str, report: ErrorSink | None, storage_options: dict[str, Any] | None,
              allow_pipe: bool | None) -> Iterator[Sample]:
    # storage.schemes imports fsspec: keep it off the import path of tar-only users
    from shardflow.storage.schemes import open_read

    stream = open_read(url, storage_options, allow_pipe=allow_pipe)
    try:
        members = iter_members(stream, url, resync=on_error != "raise")
        yield from iter_samples(members, url, on_error=on_error, report=report)
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
        why = check_ext(ext)
        if why:
            raise SampleError(why, key=key)
        if isinstance(value, FileValue):  # a file streamed by the tar writer (storage.file_value)
            members.append((f"{key}.{ext}", value))  # type: ignore[arg-type]
            continue
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SampleError(f"value for {ext!r} is {type(value).__name__}, not bytes (encode it first)", key=key)
        members.append((f"{key}.{ext}", bytes(value)))
    if not members:
        raise SampleError("sample has no data entries (only __ metadata)", key=key)
    return members
