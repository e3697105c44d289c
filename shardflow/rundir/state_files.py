"""Run-directory files that cannot be read back: one line naming the file and what to do about it.

RunDir writes every file atomically, so a torn or foreign one comes from outside (a hand edit, a copy
cut short, a disk fault, another program). A bare `JSONDecodeError: Unterminated string ...` names
neither the file nor a way out; `loads` raises RunStateError (a JobError: the CLI prints it as one line
with status 2, a worker stops with 78) naming the file, why, and what fixes it for that kind of file
(`what_to_do`). Files that can be rebuilt are not errors at all: their readers take an unreadable one
as missing (`loads_or_none`: summaries/, merged again from the done markers; lease.json: rundir.lease
reads it as an expired lease of an unknown holder), and `--redo` plans again over an unreadable plan
(job.shard_job.prepare).
"""

from __future__ import annotations

import json
from typing import Any

from shardflow.errors import RunStateError
from shardflow.rundir.layout import DONE, ERRORS, FAILED, JOB_RECORD, LAST_RUN, PLAN, PLAN_CHUNKS, SUMMARY

_REDO = "rerun the job with --redo (redo=True): it plans again from the job and starts over"


def what_to_do(where: str) -> str:
    """How to get past the unreadable run-directory file at `where` (its URL or path), by its name."""
    folder, _, base = where.rpartition("/")
    folder = folder.rpartition("/")[2]
    if base == PLAN or (folder == PLAN_CHUNKS and base.startswith("chunk-")):
        return _REDO
    if folder == DONE:
        return "delete it and rerun: that task runs again (its outputs are rewritten, the same bytes)"
    if folder in (FAILED, ERRORS):
        return "delete it: it only records why that task failed"
    if base in (SUMMARY, LAST_RUN):
        return "delete it and rerun: a rerun writes it again"
    if base == JOB_RECORD:
        return "prepare the run again (shardflow run, shardflow plan, or shardflow k8s/argo): it is rewritten"
    return f"delete it, or {_REDO}"


def unreadable(where: str, error: BaseException) -> RunStateError:
    """The one-line error of the run-directory file at `where` (its URL or path) that `error` kept from
    being read."""
    return RunStateError(f"{where} cannot be read ({type(error).__name__}: {error}): damaged, or not written by "
                         f"shardflow; {what_to_do(where)}")


def loads(data: bytes | str, where: str) -> Any:
    """JSON of the run-directory file at `where`; RunStateError naming it when it does not parse."""
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise unreadable(where, exc) from exc


def loads_or_none(data: bytes | str | None) -> Any:
    """JSON of a file that can be rebuilt: None (as if it were missing) when it is absent or does not parse."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None
