"""The one temp-name convention, and atomic publication of small local files.

Whatever shardflow writes under a final name (a shard, a run-directory file, a cached shard) is first
written to a hidden sibling `.<name>.tmp-[<tag>-]<random>` and renamed in only when whole, so a
reader sees the old content or the new, never a mix. The shard writer, the run directory and the
reader's cache all use these functions, so a rerun can recognise (and remove) exactly the temps a
killed writer left, by the same rule everywhere.
"""

from __future__ import annotations

import os
import uuid

from shardflow.storage.local_files import open_write_named

TEMP_MARK = ".tmp-"


def temp_name(path: str, tag: str = "") -> str:
    """Hidden sibling name used while `path` (a local path or URL) is being written.

    `tag` (e.g. a job's task tag) lets a rerun find exactly the temps of one task and no others.
    """
    head, slash, base = path.rpartition("/")
    return f"{head}{slash}.{base}{TEMP_MARK}{tag + '-' if tag else ''}{uuid.uuid4().hex[:12]}"


def temp_glob(path: str = "", tag: str = "") -> str:
    """Glob pattern (a basename) matching the temps of `path`, or every temp of `tag` in a folder."""
    if tag:
        return f".*{TEMP_MARK}{tag}-*"
    return f".{path.rstrip('/').rpartition('/')[2]}{TEMP_MARK}*"


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


def write_local_atomic(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Write a local file so readers see the old content or the new, never a truncated one."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temp = temp_name(path)
    try:
        with open_write_named(temp, path) as f:  # a full disk names `path`
            f.write(data)
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
