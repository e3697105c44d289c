"""The layout of a run directory: the one owner of every name in it.

    plan.json              the tasks, written once up front, with a fingerprint
    plan/chunk-*.json      tasks whose names follow no numbering (rundir.plan_store)
    job.pkl                the job (cloudpickle), so Dask workers and pods can rebuild it
    job.json               versions that wrote job.pkl, and a job file's source (job.jobrecord)
    lease.json             the driver that holds the run (rundir.lease)
    lease.json.taken-<h>   a takeover of the lease whose bytes hash to <h> (local run dirs; rundir.lease)
    done/000017.json       completion marker of task 17: outputs + stats; written LAST
    failed/000017.json     why task 17 failed last time (removed when it later succeeds)
    errors/000017.jsonl    one line per dropped/failed sample of task 17
    summaries/A-B.json     the merged markers of tasks A..B-1 (rundir.summaries)
    records/000017.d....   task 17's times, counts and worker, in the file's name (rundir.records)
    running/000017.T.W     task 17 runs on worker W since T (removed when it ends)
    summary.json           the merged report of the last run (its shard list is the reader's manifest)
    last_run.json          the same without the shard list (a few KB at any N: what `status` reads)

The default run directory is `_shardflow` beside the outputs, which is also where the reader and the
progress bar look for the summary of shards a run wrote (`summary_beside`); beside it may stand
`_shardflow-<job>-<hash>` (another job's run directory over the same folder) and `_shardflow-limit-<job>`
(trial runs).
"""

from __future__ import annotations

from typing import Any, Protocol

from shardflow.storage.paths import join

PLAN = "plan.json"
JOB_PICKLE = "job.pkl"
JOB_RECORD = "job.json"
LEASE = "lease.json"
SUMMARY = "summary.json"
LAST_RUN = "last_run.json"  # summary.json less its shard list: what `status` reads (rundir.report)
DONE, FAILED, ERRORS, SUMMARIES, PLAN_CHUNKS = "done", "failed", "errors", "summaries", "plan"
RECORDS, RUNNING = "records", "running"  # task records in file names (rundir.records)
OWN_FOLDERS = ("", DONE, FAILED, ERRORS, SUMMARIES, PLAN_CHUNKS, RECORDS, RUNNING)  # every folder it writes
DEFAULT_NAME = "_shardflow"  # the run directory beside a job's outputs
SCRATCH_PREFIX = DEFAULT_NAME + "-limit-"  # a job's trial runs (--limit): `_shardflow-limit-<job>`


class RunFiles(Protocol):
    """The file operations of a run directory (RunDir has them), for the modules RunDir itself calls
    (plan_store, summaries): typed so rather than as RunDir, with no import cycle."""

    def read_json(self, name: str) -> Any: ...

    def write_json(self, name: str, obj: Any) -> None: ...

    def write_bytes(self, name: str, data: bytes) -> None: ...

    def list_names(self, folder: str, *, prefix: str = "") -> list[str]: ...

    def read_many(self, names: list[str], *, parse: bool = True) -> list[Any]: ...


def task_name(task_id: int) -> str:
    """The file stem of task `task_id` in done/, failed/, errors/: 000017."""
    return f"{task_id:06d}"


def done_file(task_id: int) -> str:
    return f"{DONE}/{task_name(task_id)}.json"


def failed_file(task_id: int) -> str:
    return f"{FAILED}/{task_name(task_id)}.json"


def lease_taken_file(digest: str) -> str:
    """The marker a driver creates (O_EXCL) to take over the lease whose bytes hash to `digest`."""
    return f"{LEASE}.taken-{digest}"


def errors_file(task_id: int) -> str:
    return f"{ERRORS}/{task_name(task_id)}.jsonl"


def job_label(name: object) -> str:
    """A job's name as it appears in the folder names below (letters, digits, - and _; at most 40)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(name))[:40] or "job"


def own_run_dir_name(name: object, digest: str) -> str:
    """`_shardflow-<job>-<digest>`: the run directory of a job whose outputs share a folder with another's."""
    return f"{DEFAULT_NAME}-{job_label(name)}-{digest}"


def scratch_name(name: object) -> str:
    """`_shardflow-limit-<job>`: the folder a job's trial runs write to, beside its outputs."""
    return SCRATCH_PREFIX + job_label(name)


def summary_beside(shard_folder: str) -> str:
    """The summary.json a run with the default run directory left beside the shards of `shard_folder`."""
    return join(shard_folder, DEFAULT_NAME, SUMMARY)
