"""The job a pod runs: rebuilt from the job file's recorded source, or unpickled after a version check.

`job.jobrecord` writes job.json beside job.pkl. A job that came from a job file is rebuilt here from
the file's source and settings (no pickle: the submitter's Python and packages do not matter); any
other job is unpickled, but only when the Python, cloudpickle and shardflow versions that wrote it
match this image's, because a mismatched pickle can crash inside the user's function (exit 139 on
every retry) instead of failing clearly. Run directories without job.json (older shardflow) unpickle
as before.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardflow.cluster.contract import EXIT_RETRY, EXIT_STOP, WorkerExit
from shardflow.errors import JobError
from shardflow.job.jobrecord import load_job_pickle, version_mismatch
from shardflow.rundir.layout import JOB_PICKLE, JOB_RECORD
from shardflow.rundir.run_dir import RunDir

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

def _read(run_dir: RunDir, name: str) -> bytes | None:
    try:
        return run_dir.read_bytes(name)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - network, permissions, throttling: all worth a retry
        raise WorkerExit(EXIT_RETRY, f"run directory {run_dir.url} unreachable: {type(exc).__name__}: {exc}") from exc


def read_record(run_dir: RunDir) -> dict[str, Any] | None:
    """job.json of the run directory, or None when it has none (written by shardflow before 0.2)."""
    data = _read(run_dir, JOB_RECORD)
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise WorkerExit(EXIT_STOP, f"{run_dir.url}/{JOB_RECORD} is not JSON ({exc}); prepare the run again") from exc
    return record if isinstance(record, dict) else None


def rebuild_from_source(job_file: dict[str, Any], where: str) -> ShardJob:
    """The ShardJob of a recorded job file: its source run as a fresh module, with the recorded settings
    (every JobSpec field the driver's job had: JobSpec.record_settings), the same job as the driver's."""
    from shardflow.job.jobfile import job_from_file, load_job_file

    folder = Path(tempfile.mkdtemp(prefix="shardflow-job-"))
    path = folder / Path(str(job_file.get("name") or "job.py")).name
    path.write_text(str(job_file.get("source", "")), encoding="utf-8")
    settings = dict(job_file.get("settings") or {})
    try:
        loaded = load_job_file(path)
        params = settings.pop("params", None)
        if loaded.params is not None and isinstance(params, dict):
            loaded.params.clear()  # process() reads the module's PARAMS: give it the recorded values
            loaded.params.update(params)
        return job_from_file(loaded, recorded=settings)
    except (JobError, KeyError, TypeError, ValueError) as exc:
        raise WorkerExit(EXIT_STOP, f"cannot rebuild the job from the job file recorded in {where} in this "
                                    f"image: {exc}") from exc


def load_job(run_dir: RunDir) -> ShardJob:
    """The job of `run_dir` for this pod (see the module docstring); WorkerExit says why not."""
    record = read_record(run_dir)
    where = f"{run_dir.url}/{JOB_RECORD}"
    if record is not None and record.get("job_file"):
        return rebuild_from_source(record["job_file"], where)
    if record is not None:
        why = version_mismatch(record.get("versions") or {})
        if why is not None:
            raise WorkerExit(EXIT_STOP, f"{run_dir.url}/job.pkl cannot be loaded safely here: {why}; build the "
                                        "image with the same versions, or run the job from a job file (pods "
                                        "rebuild those from source)")
    data = _read(run_dir, JOB_PICKLE)
    if data is None:
        raise WorkerExit(EXIT_STOP, f"no job.pkl in run directory {run_dir.url}")
    try:
        return load_job_pickle(data)
    except Exception as exc:  # noqa: BLE001 - a module missing from the image, a version mismatch
        raise WorkerExit(
            EXIT_STOP,
            f"cannot load the job from {run_dir.url}/job.pkl in this image ({type(exc).__name__}: {exc}); "
            "the image must hold the job's module and the packages it imports",
        ) from exc
