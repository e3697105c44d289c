"""A task's shards by name: the temps a killed attempt left, the parts it committed, and the parts an
earlier run wrote beyond this run's count. Found by name (a stat per part, a HEAD on object stores), never
by listing a folder that may hold a million other shards; used where a task starts (run_task), fails
(its failure record) and ends (before its marker), and by the backends when a worker died under a task.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable

from shardflow.storage.atomic import temp_glob, temp_name
from shardflow.storage.paths import filesystem, is_local, join, local_path
from shardflow.storage.protocols import protocol_of

__all__ = ["existing_parts", "remove_parts_after", "remove_stale_temps"]


def remove_stale_temps(url: str | Callable[[int], str], storage_options: dict[str, Any] | None = None, *,
                       tag: str = "") -> int:
    """Delete temp files a crashed writer left for `url` (or for the parts `url(0)`, `url(1)`, ...).

    With `tag` (a task's), the temps are found by name: `.<part>.tmp-<tag>` for part 0, 1, ... while
    a temp or a final shard of the part exists: a few stats per task, however many files share the
    directory (object stores, which never hold temps, get no request at all). Without a tag, every
    temp of the one shard `url` is deleted (one listing of its directory).
    """
    part: Callable[[int], str] = url if callable(url) else (lambda index: url if index == 0 else "")
    first = part(0)
    if tag:
        if protocol_of(first).streaming_upload:
            return 0  # shards stream to their final key there: no temp is ever written
        return _remove_task_temps(part, storage_options, tag)
    head, slash, _ = first.rpartition("/")
    name = temp_glob(first)
    pattern = join(head, name) if head else slash + name  # slash: a file in "/" (temp_name's rule)
    fs, path = filesystem(pattern, storage_options)
    stale = fs.glob(path)
    for name in stale:
        fs.rm(name)
    return len(stale)


def _by_name(first: str, storage_options: dict[str, Any] | None
             ) -> tuple[Callable[[str], str], Callable[[str], bool], Callable[[str], Any]]:
    """(url -> path, exists, remove) for the files of a task's parts, by name: os calls for local paths
    (fsspec's exists builds an info dict: ~2x the CPU a task), the store's filesystem otherwise."""
    if is_local(first):
        return local_path, os.path.lexists, os.unlink
    fs = filesystem(first, storage_options)[0]
    return (lambda url: filesystem(url, storage_options)[1]), fs.exists, fs.rm


def _remove_task_temps(part: Callable[[int], str], storage_options: dict[str, Any] | None, tag: str) -> int:
    path_of, exists, remove = _by_name(part(0), storage_options)
    removed = 0
    for index in itertools.count():
        url = part(index)
        if not url:
            break
        final = path_of(url)
        temp = temp_name(final, tag)
        if exists(temp):
            remove(temp)
            removed += 1
        elif not exists(final):
            break  # parts are opened in order: no later part of this task was started
    return removed


def existing_parts(part: Callable[[int], str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """The final shards `part(0)`, `part(1)`, ... that exist now, up to the first that does not: what a
    task that failed leaves under final names (rollover parts it committed, or an earlier run's), which its
    failure record names. A stat (a HEAD) per part and one more."""
    return [url for url, _ in _parts_from(part, 0, storage_options)[0]]


def remove_parts_after(part: Callable[[int], str], count: int, storage_options: dict[str, Any] | None = None) -> int:
    """Delete the final shards `part(count)`, `part(count + 1)`, ... while they exist: the parts an earlier
    run of the same task wrote beyond the `count` this run wrote (a redo with a larger maxcount, code that
    now drops more samples); left there, their samples would be read twice. A stat (a HEAD on object
    stores) per task when there are none. `-` and `pipe:` outputs are not files: nothing to delete.

    They are found first and deleted from the last down, so the parts left at any moment are still
    `count, count + 1, ...` with no gap: a kill midway leaves a run of parts that the next attempt finds
    whole. (Deleted upwards, a kill after `part(count)` left `count + 1, ...` behind a gap that every later
    attempt's search stopped at: their samples stayed, read twice, for good.)"""
    stale, remove = _parts_from(part, count, storage_options)
    for _, path in reversed(stale):
        remove(path)
    return len(stale)


def _parts_from(part: Callable[[int], str], start: int, storage_options: dict[str, Any] | None
                ) -> tuple[list[tuple[str, str]], Callable[[str], Any]]:
    """(url, path) of the final shards `part(start)`, `part(start + 1)`, ... that exist, up to the first
    that does not (parts are written in order: none after a gap is this task's), and the remove for their
    paths. `-` and `pipe:` outputs are not files: none."""
    first = part(0)
    found: list[tuple[str, str]] = []
    if first == "-" or first.startswith("pipe:"):
        return found, os.unlink  # (nothing found: never called)
    path_of, exists, remove = _by_name(first, storage_options)
    for index in itertools.count(start):
        url = part(index)
        path = path_of(url)
        if not exists(path):
            break
        found.append((url, path))
    return found, remove
