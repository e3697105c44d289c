"""TaskContext: what run_task reads, as one value: the job's settings (a JobSpec) and the parts a job
builds once (its function as made per worker, codecs, run directory).

run_task never sees the job class: `ShardJob.task_context()` makes one of these, and a backend that
needs a variant (Dask wraps the function in an import guard) makes it with `dataclasses.replace`.
Settings are read as `context.spec.<name>`; there is no second list of them here.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable

from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.storage import options as so
from shardflow.task.seeds import stable_seed
from shardflow.task.spec import JobSpec

SampleFn = Callable[[Any], Any]  # fn(sample), fn(batch), or a task.worker_fn.PerWorker made per worker


@dataclass(frozen=True)
class TaskContext:
    """The job's settings with the function, codecs and run directory a task runs with."""

    spec: JobSpec
    fn: SampleFn
    run_dir: RunDir
    run_dir_url: str  # as the job names it (temp tags derive from it)
    decoder: Callable[[dict[str, Any]], dict[str, Any]] | None
    encoder: Callable[[dict[str, Any]], dict[str, Any]]
    identity: str = ""  # the job's, across pickling: the per-worker cache key of a PerWorker fn
    fn_guard: Callable[[Any], Any] | None = None  # wraps the made fn on this worker (Dask: missing modules)

    def options_for(self, url: str) -> dict[str, Any]:
        """storage_options for `url`: flat, per-prefix (longest prefix wins), `${VAR}` resolved."""
        return so.options_for(url, self.spec.storage_options)

    def temp_tag(self, task: Task) -> str:
        """Tag in the temp names of a task's shards, unique to (run directory, task)."""
        return f"{stable_seed(self.run_dir_url) % 16**8:08x}t{task.id}"


_running: ContextVar[JobSpec | None] = ContextVar("shardflow_running_spec", default=None)


def running_spec() -> JobSpec:
    """The settings of the job whose task this thread is running (set by run_task): a job's function may
    read them (its params, the seed, on_error) wherever it runs, worker, Dask worker or pod alike."""
    spec = _running.get()
    if spec is None:
        raise LookupError("no shardflow task is running in this thread")
    return spec
