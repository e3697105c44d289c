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

import json
import sys
from pathlib import Path
from typing import Any

RECORD = "job.json"
JOB_FILE_MODULE_PREFIX = "_shardflow_job_"  # job.jobfile's private module names

# ShardJob keywords a job-file job is rebuilt from (fn comes from the source; params go to PARAMS too)
SETTINGS = ("inputs", "outputs", "decode", "encode", "on_error", "seed", "maxcount", "maxsize", "inputs_per_task",
            "storage_options", "max_failure_rate", "io_retries", "retry_backoff", "allow_pickle", "allow_pipe",
            "name", "params")


def runtime_versions() -> dict[str, str]:
    """The versions a pickle depends on: Python (bytecode), cloudpickle (format), shardflow (classes)."""
    import cloudpickle

    from shardflow import __version__

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


def job_record(job: Any) -> dict[str, Any]:
    """The record written beside job.pkl (`job` as stored: secret storage options already left out)."""
    record: dict[str, Any] = {"versions": runtime_versions(), "job_file": None}
    source = job_file_source(job.fn)
    if source is None:
        return record
    settings = {name: getattr(job, name) for name in SETTINGS}
    settings["maxcount"] = job.describe()["maxcount"]
    settings["maxsize"] = job.describe()["maxsize"]
    try:
        settings = json.loads(json.dumps(settings))  # only plain JSON values can be rebuilt from
    except (TypeError, ValueError):
        return record  # e.g. a non-JSON storage option: pods use the pickle (versions still checked)
    record["job_file"] = {"name": source[0], "source": source[1], "settings": settings}
    return record
