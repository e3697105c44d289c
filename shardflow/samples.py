"""Group tar members into samples and split samples back into members.

Key rule (webdataset's): the key is the member path up to the first dot of its basename, the
extension is the rest, lower-cased. `a.b/c/000123.seg.png` -> key `a.b/c/000123`, ext `seg.png`.
Members of a sample are adjacent in the tar. Real data breaks these rules (a key that reappears later,
two members with the same extension, names with no extension); each case is reported as a
SampleError instead of being merged or dropped silently.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Iterable, Iterator

from .errors import SampleError, ShardflowError
from .tario import Corruption, Member, iter_members

Sample = dict[str, Any]
ErrorSink = Callable[[ShardflowError], None]

ON_ERROR = ("raise", "skip", "warn")


def split_name(name: str) -> tuple[str, str]:
    """Split a member path into (key, extension); extension is '' when the basename has no dot."""
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
    `report` and the offending piece is left out: the second member with an extension the sample
    already has, the members of a key that reappears later in the shard, members with no
    extension, and a sample cut by archive damage. Good samples around them are still yielded.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")

    def problem(error: ShardflowError) -> None:
        if on_error == "raise":
            raise error
        if report is not None:
            report(error)

    seen: set[str] = set()
    current: Sample | None = None
    skipping: str | None = None  # a key whose members are being left out
    for member in members:
        if isinstance(member, Corruption):
            problem(member.error)
            if current is not None:
                problem(SampleError("sample left out: archive damaged inside it", url=url, key=current["__key__"]))
            current, skipping = None, None
            continue
        key, ext = split_name(member.name)
        if not ext:
            problem(SampleError(f"member {member.name!r} has no extension (no '.' in its name)", url=url, key=key, offset=member.offset))
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
            yield current
            current = None
        if key in seen:
            problem(SampleError("key reappears later in the shard (members of a sample must be adjacent)", url=url, key=key, offset=member.offset))
            skipping = key
            continue
        seen.add(key)
        skipping = None
        current = {"__key__": key, "__url__": url, ext: member.data}
    if current is not None:
        yield current


def read_samples(
    stream: BinaryIO,
    url: str = "",
    *,
    on_error: str = "raise",
    report: ErrorSink | None = None,
) -> Iterator[Sample]:
    """Samples of one open tar stream; with on_error != 'raise' damage is reported and skipped.

    A format error that cannot be skipped (truncation, corrupt gzip) still ends the shard: it is
    raised after every sample known to be complete was yielded; the sample in progress is not.
    """
    members = iter_members(stream, url, resync=on_error != "raise")
    return iter_samples(members, url, on_error=on_error, report=report)


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
        if not ext or "/" in ext or ext.startswith("."):
            raise SampleError(f"bad extension {ext!r}", key=key)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SampleError(f"value for {ext!r} is {type(value).__name__}, not bytes (encode it first)", key=key)
        members.append((f"{key}.{ext}", bytes(value)))
    if not members:
        raise SampleError("sample has no data entries (only __ metadata)", key=key)
    return members
