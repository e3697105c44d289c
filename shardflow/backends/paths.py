"""Paths as cluster workers (Dask, Ray) must see them: absolute, and checked on the workers before any
task runs. One owner for both cluster backends (neither imports the other's folder).

A worker resolves a relative path against ITS working directory, not the driver's: relative inputs
looked missing, outputs and the run directory split in two (the client said "4 failed" while
`shardflow status` said "4 pending"). So the tasks and the run directory a cluster run sends are made
absolute on the driver (plan.json keeps what the user wrote), and a preflight stats each distinct
input directory (local) or bucket (remote) on every worker once, so that a worker blind to the inputs
stops the run with one message instead of failing every task.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from shardflow.rundir.tasks import Task
from shardflow.storage.paths import is_local, local_path, protocol

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

MAX_PROBES = 16  # distinct input places checked per worker


def absolute(url: str) -> str:
    """`url` with a relative local path made absolute against this process's working directory."""
    if url == "-" or url.startswith("pipe:") or not is_local(url):
        return url
    path = local_path(url)
    if os.path.isabs(path):
        return url
    return url[: len(url) - len(path)] + os.path.abspath(path) if "://" in url else os.path.abspath(path)


def absolute_task(task: Task) -> Task:
    return Task(task.id, tuple(absolute(u) for u in task.inputs), absolute(task.output), absolute(task.output_parts))


def absolute_run_dir(job: "ShardJob") -> "ShardJob":
    """The job bound to its run directory's absolute path, when that is a relative local path."""
    url = absolute(job.run_dir)
    if url == job.run_dir:
        return job
    from shardflow.rundir.run_dir import RunDir

    return job.at_run_dir(RunDir(url, job.options_for(url)))


def input_probes(tasks: list[Task], options_for: Callable[[str], dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """One (kind, target, storage options) per distinct input directory (local) or bucket (remote).

    Local: the directory must exist on the worker. Remote: one input of the bucket is stat'ed with the
    job's options; a missing object is the task's business, a refused or failed request is not.
    """
    seen: dict[str, tuple[str, str, Any]] = {}
    for task in tasks:
        for url in task.inputs:
            if url == "-" or url.startswith("pipe:"):
                continue
            if is_local(url):
                key = os.path.dirname(local_path(url)) or "."
                probe = ("dir", key, None)
            else:
                key = f"{protocol(url)}://{url.split('://', 1)[-1].split('/', 1)[0]}"
                probe = ("object", url, options_for(url))
            if key not in seen:
                seen[key] = probe
            if len(seen) >= MAX_PROBES:
                return list(seen.values())
    return list(seen.values())


def probe(kind: str, target: str, options: Any) -> str | None:
    """On a worker: None when it sees `target`, else why not (one line)."""
    if kind == "dir":
        return None if os.path.isdir(target) else f"no directory {target} on this worker"
    from shardflow.storage.paths import filesystem

    try:
        fs, path = filesystem(target, options)
        fs.info(path)
    except FileNotFoundError:
        return None  # the store answered: a missing input fails its own task
    except Exception as exc:  # noqa: BLE001 - no credentials, refused, unreachable
        return f"{target}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None
