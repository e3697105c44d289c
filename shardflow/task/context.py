"""TaskContext: the little that run_task needs from a job, as one value.

run_task used to read fourteen attributes of ShardJob and call back into it; it now reads this
instead, so the task layer does not depend on the job class. `ShardJob.task_context()` makes one
from the job's current settings and the parts it builds once (codecs, run directory), so a changed
setting is always seen and nothing here needs invalidating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from shardflow.rundir.run_dir import RunDir
from shardflow.task.seeds import stable_seed
from shardflow.rundir.tasks import Task
from shardflow.storage import options as so

SampleFn = Callable[[Any], Any]  # fn(sample), fn(batch), or a task.worker_fn.PerWorker made per worker


@dataclass(frozen=True)
class TaskContext:
    """Everything run_task reads: the function, codecs, policies, rollover and where things go."""

    fn: SampleFn
    run_dir: RunDir
    run_dir_url: str  # as the job names it (temp tags derive from it)
    decoder: Callable[[dict[str, Any]], dict[str, Any]] | None
    encoder: Callable[[dict[str, Any]], dict[str, Any]]
    on_error: str
    seed: int
    maxcount: int
    maxsize: float
    max_failure_rate: float
    io_retries: int
    retry_backoff: float
    allow_pipe: bool
    storage_options: dict[str, Any] | None
    debug: bool = False  # the first failure raises its original exception (serial runs under pdb)
    limit: int | None = None  # input samples per task (a trial run: job.trial)
    # batched and per-worker jobs (task/batch.py, task/worker_fn.py, task/devices.py)
    identity: str = ""  # the job's, across pickling: the per-worker cache key of a PerWorker fn
    batch_size: int | None = None  # None: fn(sample); N: fn(list of up to N samples)
    collate: bool = False  # batches as a dict of columns (stacked where shapes agree)
    device: str | None = None  # None / "cpu" / "cuda" / "auto"
    fn_guard: Callable[[Any], Any] | None = None  # wraps the made fn on this worker (Dask: missing modules)

    def options_for(self, url: str) -> dict[str, Any]:
        """storage_options for `url`: flat, per-prefix (longest prefix wins), `${VAR}` resolved."""
        return so.options_for(url, self.storage_options)

    def temp_tag(self, task: Task) -> str:
        """Tag in the temp names of a task's shards, unique to (run directory, task)."""
        return f"{stable_seed(self.run_dir_url) % 16**8:08x}t{task.id}"
