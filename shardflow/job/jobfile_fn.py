"""The function a job file defines, read by job/jobfile.py: `process`, `process_batch`, `setup`.

    def process(sample): ...            # per sample (or a batch, when BATCH_SIZE is set)
    def process_batch(batch): ...       # instead of process: a list of samples; BATCH_SIZE default 64
    def setup(): return model           # optional: runs ONCE per worker, before its first task;
    def process(sample, state): ...     #   its return value is the second argument of process /
                                        #   process_batch (one convention: no module globals to mutate)

setup() does not run where the job is only planned or submitted (`shardflow plan`, `k8s`, `argo`):
it runs in each worker (process, Dask worker, pod), once; if it raises, the tasks of that worker
fail at once with one line naming the error and the run stops.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from shardflow.errors import JobError
from shardflow.task.worker_fn import PerWorker, SetupCall

DEFAULT_BATCH_SIZE = 64


def job_function(module: types.ModuleType, path: Path) -> Any:
    """The job's fn: process or process_batch, made per worker through setup() when the file has one."""
    process, batch = getattr(module, "process", None), getattr(module, "process_batch", None)
    if callable(process) and callable(batch):
        raise JobError(f"job file {path} defines both process and process_batch; keep one")
    fn = batch if callable(batch) else process
    setup = getattr(module, "setup", None)
    if fn is None or not callable(setup):
        return fn
    return PerWorker(SetupCall, (setup, fn), name=f"setup() of {path.name}")


def batch_defaults(module: types.ModuleType, defaults: dict[str, Any]) -> dict[str, Any]:
    """A file with process_batch and no BATCH_SIZE batches by DEFAULT_BATCH_SIZE."""
    if callable(getattr(module, "process_batch", None)) and defaults.get("batch_size") is None:
        defaults["batch_size"] = DEFAULT_BATCH_SIZE
    return defaults
