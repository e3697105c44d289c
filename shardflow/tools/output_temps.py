"""Temps of a one-shot tool's output file that name their writer process, and their sweep.

A tool such as `shardflow head` writes its one output through the shard writer's atomic temp
(`.<name>.tmp-<tag>`, storage.atomic.temp_name). A job's task has a tag of its own and its rerun finds
its killed attempt's temp by name; a tool run has no task, and a SIGKILLed one would leave its temp
beside the output forever. So the tool's tag names the process that writes (`writer_tag()`), and its
next run deletes the temps of the SAME output whose writer is provably dead (rundir.pids.provably_gone:
same host, boot and PID namespace, the pid free or now another process's). Left alone: a live
writer's temp (two runs at once: each commits its own), a temp from another machine, boot or container
(its pid means nothing here), and every file in another form (`.out.tar.tmp-journal` of another program,
temps of older shardflow releases, which name no writer).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from typing import Iterable

from shardflow.rundir.pids import boot_id, pid_namespace, process_identity, provably_gone
from shardflow.storage.atomic import TEMP_MARK, tag_of_temp
from shardflow.storage.paths import is_local, local_path

_TAG = re.compile(r"w([0-9a-f]{8})p([0-9]+)s([0-9]+|x)")


def _namespace_hash() -> str:
    """8 hex of (host, boot id, PID namespace): where a pid in a tag means this machine's process."""
    text = f"{socket.gethostname()}|{boot_id()}|{pid_namespace()}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def writer_tag(identity: dict | None = None) -> str:
    """This process's temp tag, `w<namespace hash>p<pid>s<start ticks>` (`identity`: a
    process_identity() record, this process's by default)."""
    me = identity or process_identity()
    started = me.get("started")
    return f"w{_namespace_hash()}p{me['pid']}s{started if isinstance(started, int) else 'x'}"


def remove_dead_writers_temps(outputs: Iterable[str]) -> list[str]:
    """Delete the temps of the local files `outputs` whose writer (by its tag) is provably dead; returns
    their paths. One listing per folder of the outputs (at a one-shot command's start or end, not per
    task), however many outputs share it."""
    wanted: dict[str, set[str]] = {}  # folder -> names of outputs in it
    for output in outputs:
        if is_local(output):  # object stores stream to the final key; other filesystems' temps are in-process
            path = os.path.abspath(local_path(output))
            wanted.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
    here = _namespace_hash()
    removed = []
    for folder, names in wanted.items():
        try:
            with os.scandir(folder) as entries:
                found = [(e.path, _tag_of(e.name, names)) for e in entries if e.is_file(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        for temp, tag in found:
            match = _TAG.fullmatch(tag or "")
            if match is None or match.group(1) != here:
                continue  # another program's file, an older release's temp, or another machine's writer
            started = match.group(3)
            record = {"host": socket.gethostname(), "pid": int(match.group(2)), "boot_id": boot_id(),
                      "pid_ns": pid_namespace(), "started": int(started) if started != "x" else None}
            if provably_gone(record):
                try:
                    os.unlink(temp)
                    removed.append(temp)
                except OSError:
                    pass  # another rerun swept it first, or it is not ours to delete: left there
    return removed


def _tag_of(name: str, outputs: set[str]) -> str | None:
    """The tag of `name` when it is a temp of one of `outputs` (names in one folder), else None."""
    output = name[1:].rpartition(TEMP_MARK)[0]
    return tag_of_temp(name, output) if output in outputs else None
