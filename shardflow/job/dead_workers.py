"""A task whose worker processes died under it (a native crash or an out-of-memory kill on one of its
samples, os._exit in fn) until shardflow gave up on it: what is done in the workers' place, the same
wherever the task ran (processes: backends.pool_calls; dask/submit.py; ray/submit.py; a pod or Slurm
array task: cluster.dead_attempts). Here, in the job layer, because backends and cluster may not
import each other.

- The temps its killed attempts left are removed by name (task.run_task's rule: a task's next attempt
  removes them before it starts, but a task that failed has no next attempt in this run).
- The failure is recorded in failed/ (kind io: a storage error's kind, worth another try later), as
  run_task records the others, with a message that starts with WORKER_DIED (killed_its_worker reads it).
- The message names the task's input shards: the data to look at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardflow.errors import FailureKind
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.shards.task_files import remove_stale_temps

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

WORKER_DIED = "its worker process died"  # how a failure recorded here starts (backends.pool_calls reads it)


def inputs_text(task: Task) -> str:
    """A task's input shards as a message names them (the first two, and how many more)."""
    more = len(task.inputs) - 2
    return ", ".join(task.inputs[:2]) + (f" and {more} more" if more > 0 else "")


def worker_died_error(task: Task, count: int, io_retries: int, how: str, samples: int = 0,
                      then: str = "A rerun retries it") -> str:
    """The failure message of `task` whose workers died `count` times under it: how the last one ended,
    after how many samples (its last beat), its inputs, and what happens `then`."""
    return (f"{WORKER_DIED} while running it ({how}{f', after {samples} samples' if samples else ''}; input "
            f"{inputs_text(task)}), {count} time{'s' if count > 1 else ''} (io_retries={io_retries}): a native "
            f"crash or the memory limit on one of its samples? {then}")


def remove_dead_temps(job: "ShardJob", task: Task) -> None:
    """Remove, by name, the temps that the killed attempts of `task` left (best effort: a driver that
    cannot reach the outputs leaves them to the task's next attempt)."""
    try:
        tag = job.task_context().temp_tag(task)
        remove_stale_temps(task.part_url, job.options_for(task.output), tag=tag)
    except Exception:  # noqa: BLE001 - the failure is what the report must carry
        pass


def record_worker_deaths(job: "ShardJob", task: Task, error: str, attempts: int = 1) -> TaskResult:
    """`task` failed because its workers died (`error` says how, with inputs_text): temps removed, the
    failure recorded, the failed result returned."""
    remove_dead_temps(job, task)
    try:
        return job.rundir().record_failure(task, error, FailureKind.IO, attempts=attempts)
    except Exception:  # noqa: BLE001 - the report still carries the failure
        return TaskResult.failed(task.id, error, FailureKind.IO, attempts)
