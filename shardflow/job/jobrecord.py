"""job.json: what a pod must know about job.pkl before it unpickles it.

A pickle made by one Python (or cloudpickle, or shardflow) and loaded by another can crash inside the
user's function (a 3.12 code object run by 3.11 segfaulted pods, exit 139, retried on every index).
So beside job.pkl the run directory records the versions that wrote it, and, for a job that came
from a job file, the file's source and the job's settings: pods rebuild such a job from the source
instead of the pickle, so no version couples the submitter and the image.

    {"versions": {"python": "3.11.9", "shardflow": "0.1.0", "cloudpickle": "3.1.1"},
     "job_file": {"name": "augment.py", "source": "...", "settings": {...ShardJob keywords...}}}

This module builds and checks the record; `cluster.jobsource` rebuilds a job from it.
"""

from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from shardflow.rundir.layout import JOB_PICKLE, JOB_RECORD
from shardflow.rundir.run_dir import RunDir
from shardflow.version import __version__

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

JOB_FILE_MODULE_PREFIX = "_shardflow_job_"  # job.jobfile's private module names

# where job.pkl files of earlier releases name shardflow's classes -> where they live now
MOVED = {
    "shardflow.job": "shardflow.job.shard_job",
    "shardflow.run.batch": "shardflow.task.batch",
    "shardflow.run.batch_values": "shardflow.task.batch_values",
    "shardflow.run.context": "shardflow.task.context",
    "shardflow.run.create": "shardflow.tools.create",
    "shardflow.run.demo": "shardflow.tools.demo",
    "shardflow.run.devices": "shardflow.task.devices",
    "shardflow.run.failures": "shardflow.task.failures",
    "shardflow.run.fields": "shardflow.tools.fields",
    "shardflow.run.fingerprint": "shardflow.job.fingerprint",
    "shardflow.run.guard": "shardflow.job.guard",
    "shardflow.run.inputs": "shardflow.job.inputs",
    "shardflow.run.job": "shardflow.job.shard_job",
    "shardflow.run.jobfile": "shardflow.job.jobfile",
    "shardflow.run.jobfile_fn": "shardflow.job.jobfile",
    "shardflow.run.jobrecord": "shardflow.job.jobrecord",
    "shardflow.run.lazy_plan": "shardflow.job.lazy_plan",
    "shardflow.run.lease": "shardflow.rundir.lease",
    "shardflow.run.listing": "shardflow.rundir.listing",
    "shardflow.run.naming": "shardflow.job.naming",
    "shardflow.run.overlap": "shardflow.task.overlap",
    "shardflow.run.pids": "shardflow.rundir.pids",
    "shardflow.run.plan_store": "shardflow.rundir.plan_store",
    "shardflow.run.plan_table": "shardflow.rundir.plan_table",
    "shardflow.run.preview": "shardflow.tools.preview",
    "shardflow.run.process": "shardflow.task.process",
    "shardflow.run.progress": "shardflow.job.progress",
    "shardflow.run.report": "shardflow.rundir.report",
    "shardflow.run.run_task": "shardflow.task.run_task",
    "shardflow.run.rundir": "shardflow.rundir.run_dir",
    "shardflow.run.seeds": "shardflow.task.seeds",
    "shardflow.run.shell": "shardflow.job.shell",
    "shardflow.run.shell_files": "shardflow.job.shell_files",
    "shardflow.run.shell_jobfile": "shardflow.job.shell",
    "shardflow.run.sort": "shardflow.tools.sort",
    "shardflow.run.stats": "shardflow.rundir.stats",
    "shardflow.run.status": "shardflow.rundir.status",
    "shardflow.run.summaries": "shardflow.rundir.summaries",
    "shardflow.run.task": "shardflow.rundir.tasks",
    "shardflow.run.threads": "shardflow.task.threads",
    "shardflow.run.tracebacks": "shardflow.rundir.tracebacks",
    "shardflow.run.trial": "shardflow.job.trial",
    "shardflow.run.worker_fn": "shardflow.task.worker_fn",
}

def runtime_versions() -> dict[str, str]:
    """The versions a pickle depends on: Python (bytecode), cloudpickle (format), shardflow (classes)."""
    return {"python": ".".join(map(str, sys.version_info[:3])), "shardflow": __version__,
            "cloudpickle": cloudpickle.__version__}


def version_mismatch(recorded: dict[str, str], here: dict[str, str] | None = None) -> str | None:
    """Why a pickle written with `recorded` versions must not be loaded here, or None when it may.

    Python must agree on major.minor (code objects change between minor versions); cloudpickle and
    shardflow must be the same version.
    """
    here = here or runtime_versions()
    problems = []
    for name in ("python", "cloudpickle", "shardflow"):
        old, new = recorded.get(name), here.get(name)
        if old is None:
            continue
        same = old.split(".")[:2] == new.split(".")[:2] if name == "python" else old == new
        if not same:
            problems.append(f"{name} {old} wrote it, this image has {name} {new}")
    return "; ".join(problems) or None


def job_file_source(fn: Any) -> tuple[str, str] | None:
    """(file name, source) when `fn` is the process() of a job file loaded by job.jobfile, else None."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or not module.__name__.startswith(JOB_FILE_MODULE_PREFIX):
        return None
    path = getattr(module, "__file__", None)
    if not path or getattr(module, "process", None) is not fn:
        return None
    try:
        return Path(path).name, Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def job_record(job: ShardJob) -> dict[str, Any]:
    """The record written beside job.pkl (`job` as stored: secret storage options already left out).

    A job file's job records every setting of its JobSpec (JobSpec.record_settings), so the pod's job is
    the driver's: batch_size, device and any setting added later included."""
    record: dict[str, Any] = {"versions": runtime_versions(), "job_file": None}
    source = job_file_source(job.fn)
    if source is None:
        return record
    try:
        settings = json.loads(json.dumps(job.spec.record_settings()))  # only plain JSON values can be rebuilt from
    except (TypeError, ValueError):
        return record  # e.g. a non-JSON storage option: pods use the pickle (versions still checked)
    record["job_file"] = {"name": source[0], "source": source[1], "settings": settings}
    return record


def save_job(run_dir: RunDir, job: ShardJob) -> None:
    """Store the job for workers and pods, without secrets: job.pkl and its record job.json.

    Secret storage options (keys, tokens, passwords) are left out: whoever loads the job takes
    credentials from its own environment or from `${VAR}` references, never from this file.
    """
    stored = job.replace(**job.spec.redactions())  # credentials and URL passwords: memory only
    run_dir.write_bytes(JOB_PICKLE, cloudpickle.dumps(stored))
    run_dir.write_json(JOB_RECORD, job_record(stored))  # versions (checked before unpickling), job-file source


class _MovedNames(pickle.Unpickler):
    """Unpickles job.pkl files that name classes where earlier releases kept them (shardflow.run.*,
    shardflow.job before it was a package): MOVED maps each old module to its new one."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED.get(module, module), name)


def load_job_pickle(data: bytes) -> Any:
    """A job.pkl's job (cloudpickle's format is plain pickle), old module paths mapped to new ones."""
    return _MovedNames(io.BytesIO(data)).load()
