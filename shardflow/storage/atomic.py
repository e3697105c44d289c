"""The one temp-name convention, and atomic publication of local files (and of big streamed objects).

Whatever shardflow writes under a final name (a shard, a run-directory file, a cached shard) is first
written to a hidden sibling and renamed in only when whole, so a reader sees the old content or the
new, never a mix. Two forms, both made here:

- `.<name>.tmp-<tag>` (`temp_name(path, tag)`): the temp of one task's shard. It is derived from the
  output name and the task's tag alone, so a rerun finds a killed attempt's temps by name (one stat
  per output part), never by listing the output directory (O(files there) per task: quadratic).
- `.<name>.tmp-[<tag>-]<12 hex>` (`temp_name(path, tag, unique=True)`, or no tag): files several
  writers may write at once (run-directory files, cached shards); `is_own_temp(name, tag)` matches
  exactly this form, so a cleanup never deletes another program's `.x.tmp-journal`.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any, Callable, Iterable, TypeVar

from shardflow.storage.local_files import open_write_named

_File = TypeVar("_File")

TEMP_MARK = ".tmp-"
_UNIQUE = re.compile(r"[0-9a-f]{12}")


def temp_name(path: str, tag: str = "", *, unique: bool = False) -> str:
    """Hidden sibling name used while `path` (a local path or URL) is being written.

    With a `tag` (a task's tag) and not `unique`, the name is `.<name>.tmp-<tag>`: derived from the
    path and the tag alone, so the task's rerun finds it without a listing. Otherwise a random suffix
    keeps concurrent writers of the same path apart.
    """
    head, slash, base = path.rpartition("/")
    if tag and not unique:
        return f"{head}{slash}.{base}{TEMP_MARK}{tag}"
    return f"{head}{slash}.{base}{TEMP_MARK}{tag + '-' if tag else ''}{uuid.uuid4().hex[:12]}"


def is_own_temp(name: str, tag: str) -> bool:
    """True only for a basename made by `temp_name(..., tag, unique=True)` (exactly that form)."""
    base = name.rpartition("/")[2]
    head, mark, rest = base.rpartition(f"{TEMP_MARK}{tag}-")
    return bool(mark) and head.startswith(".") and len(head) > 1 and _UNIQUE.fullmatch(rest) is not None


def temp_glob(path: str) -> str:
    """Glob pattern (a basename) matching every temp of `path` (any tag, any suffix)."""
    return f".{path.rstrip('/').rpartition('/')[2]}{TEMP_MARK}*"


def tag_of_temp(name: str, path: str) -> str | None:
    """The tag of `name` when it is a temp of `path` in the derived form (`temp_name(path, tag)`), else
    None: how a sweep reads whose temp it found (the tag is its writer's), never a second naming rule."""
    prefix = f".{path.rstrip('/').rpartition('/')[2]}{TEMP_MARK}"
    base = name.rpartition("/")[2]
    return (base[len(prefix):] or None) if base.startswith(prefix) else None


def is_temp_name(name: str) -> bool:
    """True for a basename made by `temp_name`."""
    base = name.rpartition("/")[2]
    return base.startswith(".") and TEMP_MARK in base


def fsync_dir(path: str) -> None:
    """Make a rename in directory `path` durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def in_new_folders(open_file: Callable[[str, str], _File], temp: str, label: str) -> _File:
    """`open_file(temp, label)`, creating `temp`'s folders first when they are missing. The open is
    tried first: os.makedirs on a folder that exists costs three system calls and an exception, and
    a run writes two files a task into folders that exist (~10 us of every tiny task)."""
    try:
        return open_file(temp, label)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(os.path.abspath(temp)), exist_ok=True)
        return open_file(temp, label)


def write_local_atomic(path: str, data: bytes | Iterable[bytes], *, fsync: bool = True, tag: str = "") -> None:
    """Write a local file so readers see the old content or the new, never a truncated one.

    `data`: the bytes, or chunks of them (a file too big to hold whole, e.g. summary.json at a million
    shards); an exception while they are made leaves no temp and the old file in place.
    `tag` marks the temp (`.<name>.tmp-<tag>-<random>`) so its owner can clean up exactly its own."""
    temp = temp_name(path, tag, unique=True)
    try:
        with in_new_folders(open_write_named, temp, path) as f:  # a full disk names `path`
            for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(chunk)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def publish_chunks(fs: Any, path: str, chunks: Iterable[bytes], *, small: int = 8 << 20) -> None:
    """Write `chunks` to `path` on an object store so that it appears whole or not at all.

    Up to `small` bytes: one `pipe_file` (a single PUT, retried like any call of `fs`). Larger: one
    upload through `fs.open(path, "wb")` (a multipart upload on s3fs, gcsfs), which publishes the
    object only when closed; if making or sending a chunk fails, the upload is discarded (the
    multipart upload aborted) and marked closed, so neither the error nor garbage collection (an
    fsspec file commits in `__del__`) publishes a partial object. The large upload is not retried
    across an outage as `pipe_file` is (its parts are retried by the store's client)."""
    buffered: list[bytes] = []
    size = 0
    iterator = iter(chunks)
    for chunk in iterator:
        buffered.append(chunk)
        size += len(chunk)
        if size > small:
            break
    else:
        fs.pipe_file(path, b"".join(buffered))
        return
    f = fs.open(path, "wb")
    try:
        for chunk in buffered:
            f.write(chunk)
        del buffered[:]
        for chunk in iterator:
            f.write(chunk)
        f.close()  # publishes (completes the multipart upload)
    except BaseException:
        try:
            f.discard()
        finally:
            f.closed = True
        raise
