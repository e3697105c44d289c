"""Unfinished uploads of a task's own outputs, aborted when the task starts again.

A shard streamed to an object store is a multipart upload completed only by a clean close
(storage.publish.StreamingUpload): a writer killed with SIGKILL never publishes half a shard, but on
S3 its started upload and parts stay open, billed and invisible to a normal listing, until someone
aborts them. This is the object-store twin of the `.<name>.tmp-<tag>` temps a rerun removes by name
on a local disk (shards.task_files.remove_stale_temps), and it runs at the same moment: when a task
(re)starts, before it writes anything.

Which uploads are dead: only those of the starting task's OWN output keys (its part 0 and its
rollover parts, matched exactly), listed before this attempt began. The run lease lets one driver
run a run directory, and a task runs in one place at a time, so another upload of those keys is an
older attempt that was killed (or a duplicate whose commit must lose anyway, as a twin's local temp
does). Uploads of any other key in the folder (another task, another run, another program) are
never touched.

Requests: the protocol's record says whether its store keeps leftovers (Protocol.open_uploads: S3
multipart; gcsfs's resumable upload sessions are not objects, cannot be listed and expire after a
week, so gs:// has none). Where it does, the folder is listed ONCE per process and run directory (a
ListMultipartUploads with the folder as prefix: one request per 1,000 open uploads, normally one),
and every task of that process looks its keys up in that answer: a run of 100k tasks over P worker
processes costs P listings, not 100k (an output pattern that gives each task its own folder, {task}
in a folder name, still costs one listing per task). That listing cannot see the upload of a task
killed mid-run and handed to a process that had listed before the kill, and a finished task is never
redone; so the driver (job.driver), once every task of its run has reported, lists each output
folder once more and aborts what is still open for the run's keys (abort_left_uploads). Pods, array
jobs and a run that stopped early have no such end: the bucket's lifecycle rule
(docs/object-storage.md) is the second net.
"""

from __future__ import annotations

import logging
import os
import re
import string
import threading
from typing import Any, Callable, Iterable

from fsspec import get_filesystem_class

from shardflow.storage.paths import filesystem, protocol
from shardflow.storage.protocols import Protocol, load, protocol_of
from shardflow.storage.retry import describe
from shardflow.storage.upload import OpenUpload

log = logging.getLogger("shardflow.storage.stale_uploads")


# (scope, protocol, folder) -> {key: [upload ids]}: one listing per process, run and folder
_LISTED: dict[tuple[str, str, str], dict[str, list[str]]] = {}
_LOCK = threading.Lock()


def _after_fork() -> None:
    """A child forked while another thread listed must not inherit a held lock."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def abort_own_uploads(output: str, output_parts: str, storage_options: dict[str, Any] | None = None, *,
                      scope: str = "") -> int:
    """Abort the unfinished uploads of `output` and its rollover parts (`output_parts`, a format string
    with a {part} field); return how many were aborted. Never raises: a store that refuses the
    listing or the abort keeps its leftovers, and the task runs as before.

    `scope` names whose listing may be reused (the run directory): a process running many tasks of
    one run lists each output folder once, at its first task.
    """
    record = protocol_of(output)
    if record.open_uploads is None:
        return 0  # the store keeps no unfinished upload (or shardflow cannot list them)
    names = _names(output, output_parts)
    if names is None:
        return 0
    path, parts, folder = names
    cache_key = (scope, record.name, folder)
    with _LOCK:  # threads of one process (a Dask worker) wait for the first one's listing
        listed = _LISTED.get(cache_key)
        if listed is None:
            listed = _LISTED[cache_key] = _list(record.open_uploads[0], output, folder, storage_options)
        if not listed:
            return 0  # the usual case: nothing was left open
        doomed = [(key, upload_id) for key in _own_keys(listed, path, parts) for upload_id in listed.pop(key)]
    return _abort(record.open_uploads[1], output, doomed, storage_options) if doomed else 0


def abort_left_uploads(outputs: Iterable[tuple[str, str]], options_for: Callable[[str], dict[str, Any] | None],
                       *, max_folders: int = 64) -> int:
    """At the end of a run whose every task has reported: abort the unfinished uploads of those tasks'
    keys (`outputs`: their (output, output_parts)), one listing per output folder. Never raises.

    The driver calls it (job.driver) holding the run's lease, once no task of the run is in flight, so
    an upload still open for one of these keys belongs to a dead attempt: a task killed mid-run and
    done again by a process whose listing was older than the kill (which abort_own_uploads cannot
    see). A plan spread over more than `max_folders` folders ({task} in a folder name) is left to
    the per-task path: a listing per folder would be one per task.
    """
    groups: dict[str, list[tuple[str, str]]] = {}  # by the output's folder as written: ~0.3 us a task
    records: dict[str, Protocol] = {}  # by the text before "://": one lookup per scheme, not per task
    for output, output_parts in outputs:
        scheme = output.partition("://")[0] if "://" in output else ""
        record = records.get(scheme) or records.setdefault(scheme, protocol_of(output))
        if record.open_uploads is not None:
            groups.setdefault(output.rpartition("/")[0], []).append((output, output_parts))
    if len(groups) > max_folders:
        return 0
    aborted = 0
    for tasks in groups.values():
        url = tasks[0][0]
        record, names, options = protocol_of(url), _names(*tasks[0]), options_for(url)
        if names is None or record.open_uploads is None:
            continue
        listed = _list(record.open_uploads[0], url, names[2], options)  # the folder holding every part
        if listed:  # rare: only now are the tasks' keys worked out
            entry = _Folder(tasks)
            doomed = [(key, upload_id) for key in listed if entry.owns(key) for upload_id in listed[key]]
            aborted += _abort(record.open_uploads[1], url, doomed, options) if doomed else 0
    return aborted


class _Folder:
    """The output keys of a run's tasks in one folder: exact names, and rollover formats by literal head."""

    def __init__(self, tasks: list[tuple[str, str]]) -> None:
        self.keys: set[str] = set()
        self.parts: dict[str, list[str]] = {}
        for output, output_parts in tasks:
            names = _names(output, output_parts)
            if names is not None:
                self.keys.add(names[0])
                if names[1]:
                    self.parts.setdefault(_literal_head(names[1]), []).append(names[1])

    def owns(self, key: str) -> bool:
        if key in self.keys:
            return True
        heads = (key[:end] for end in range(len(key), -1, -1) if key[:end] in self.parts)
        return any(_own_keys({key: []}, "", parts) for head in heads for parts in self.parts[head])


def _names(output: str, output_parts: str) -> tuple[str, str, str] | None:
    """(part 0's path, the rollover format's path, the folder holding both) as the store names them
    (`bucket/dir/x-000.tar`, `bucket/dir/x-{part:03d}.tar`, `bucket/dir/`): the filesystem class's own
    rule, no client made. None where the URL names no filesystem (its writer reports that)."""
    try:
        strip = get_filesystem_class(protocol(output))._strip_protocol
        path, parts = strip(output), strip(output_parts) if output_parts else ""
    except Exception:  # noqa: BLE001
        return None
    return path, parts, _common_folder(path, _literal_head(parts))


def _abort(aborter: str, url: str, doomed: list[tuple[str, str]], storage_options: dict[str, Any] | None) -> int:
    """Abort each (key, upload id); how many were. A refusal is logged, never raised."""
    aborted = 0
    for key, upload_id in doomed:
        try:
            load(aborter)(filesystem(url, storage_options)[0], OpenUpload(key, upload_id))
            aborted += 1
        except Exception as exc:  # noqa: BLE001
            log.info("could not abort the unfinished upload of %s (%s)", key, describe(exc, storage_options))
    if aborted:
        log.info("aborted %d unfinished upload(s) that killed attempts left beside %s", aborted, url)
    return aborted


def _list(lister: str, url: str, folder: str, storage_options: dict[str, Any] | None) -> dict[str, list[str]]:
    """The open uploads under `folder` by key; none when the store refuses to list them (asked once:
    a refused listing then costs no request per task)."""
    try:
        uploads = load(lister)(filesystem(url, storage_options)[0], folder)
    except Exception as exc:  # noqa: BLE001 - best effort; the bucket's lifecycle rule is the second net
        log.warning("could not list the unfinished uploads in %s (%s); those of killed tasks stay open",
                    folder, describe(exc, storage_options))
        return {}
    out: dict[str, list[str]] = {}
    for upload in uploads:
        out.setdefault(upload.key, []).append(upload.upload_id)
    return out


def _literal_head(pattern: str) -> str:
    """The text of a format string before its first field (`s3://b/out/x-{part:03d}.tar` -> `s3://b/out/x-`)."""
    head = []
    for literal, field, _, _ in string.Formatter().parse(pattern):
        head.append(literal)
        if field is not None:
            break
    return "".join(head)


def _common_folder(first: str, parts_head: str) -> str:
    """The deepest folder (`bucket/a/b/`) holding part 0 and every rollover part."""
    common = first if not parts_head else os.path.commonprefix([first, parts_head])
    return common.rpartition("/")[0] + "/"


def _own_keys(listed: dict[str, list[str]], first: str, parts: str) -> list[str]:
    """The listed keys that are `first` or a rollover part of `parts` (exactly: a part number read
    from the key must format back to the same key)."""
    matcher = _part_matcher(parts) if parts else None
    own = []
    for key in listed:
        if key == first:
            own.append(key)
        elif matcher is not None:
            found = matcher.fullmatch(key)
            if found is not None and parts.format(part=int(found.group(1))) == key:
                own.append(key)
    return own


def _part_matcher(parts: str) -> re.Pattern[str] | None:
    """A regex of `parts` with its {part} field as digits (None when it has no such field)."""
    pieces = []
    seen = False
    for literal, field, _, _ in string.Formatter().parse(parts):
        pieces.append(re.escape(literal))
        if field == "part" and not seen:
            pieces.append(r"(\d+)")
            seen = True
        elif field is not None:
            pieces.append(r"\d+")  # a repeated {part}: checked by formatting back
    return re.compile("".join(pieces)) if seen else None
