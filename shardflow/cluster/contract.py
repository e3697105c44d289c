"""What pods, manifests and the orchestrator agree on: exit codes, the index variable, chunks.

A chunk is a fixed slice of task ids: index I with K tasks per index runs tasks [I*K, (I+1)*K) of the
plan. The manifests (Kubernetes podFailurePolicy, Argo retryStrategy) act on the exit codes; the worker
returns them. Both import this module and nothing else of each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from shardflow.errors import RAISE, FailureKind
from shardflow.task.spec import setting_default

EXIT_OK = 0  # every task of the chunk is done (now or by an earlier attempt)
EXIT_BAD_INPUT = 65  # EX_DATAERR: a task failed on its input (bad shard, broken fn); retrying gives the same
EXIT_RETRY = 75  # EX_TEMPFAIL: storage unreachable, I/O errors after retries, SIGTERM (eviction, preemption)
EXIT_STOP = 78  # EX_CONFIG: stop the whole run (no plan, job not loadable in this image, on_error="raise")

EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_BAD_INPUT: "bad input: do not retry this index",
    EXIT_RETRY: "transient failure: retry this index",
    EXIT_STOP: "fatal for the whole run: stop every index",
}

INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes Indexed Jobs
SLURM_INDEX_ENV = "SLURM_ARRAY_TASK_ID"  # set by Slurm in each task of a job array
# Signals that stop a worker cleanly (its temp outputs removed, exit EXIT_RETRY): SIGTERM (eviction, scancel,
# a node draining), SIGINT, and SIGUSR1, the warning Slurm sends before a time limit or preemption
# (`sbatch --signal=B:USR1@90`, passed on by the script), after which the array task requeues itself.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


def index_retries(io_retries: int) -> int:
    """Retries of one index (Kubernetes backoffLimitPerIndex, Argo retryStrategy.limit, the Slurm script's
    RETRIES) when none is given: one more than the job's io_retries. A task that kills its pod's process
    (a native crash, the memory limit) is run again until it has killed io_retries + 1 of them, and the
    attempt after that records it failed without running it (cluster.dead_attempts); with fewer retries
    the index gave up first, with nothing in failed/ to say which task or shard."""
    return io_retries + 1


DEFAULT_INDEX_RETRIES = index_retries(setting_default("io_retries"))  # a job with the default io_retries


class WorkerExit(Exception):
    """Stop the worker with `code`; the message goes to stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Chunk:
    index: int
    first: int  # first task id
    stop: int  # one past the last task id

    @property
    def task_ids(self) -> range:
        return range(self.first, self.stop)


def chunk_count(tasks: int, tasks_per_index: int) -> int:
    """How many indexes (pods, Argo items) cover `tasks` tasks in chunks of `tasks_per_index`."""
    return math.ceil(tasks / tasks_per_index)


def chunk_of(index: int, tasks_per_index: int, tasks: int) -> Chunk:
    """The task ids of `index`; WorkerExit(EXIT_STOP) when the index or chunk size does not fit the plan."""
    if tasks_per_index < 1:
        raise WorkerExit(EXIT_STOP, f"--tasks-per-index must be >= 1, not {tasks_per_index}")
    count = chunk_count(tasks, tasks_per_index)
    if not 0 <= index < count:
        raise WorkerExit(
            EXIT_STOP,
            f"index {index} is outside the plan: {tasks} tasks in chunks of {tasks_per_index} make indexes "
            f"0..{count - 1}; the manifest does not match the plan in the run directory (regenerate it)",
        )
    first = index * tasks_per_index
    return Chunk(index, first, min(first + tasks_per_index, tasks))


def exit_code(failure_kinds: Sequence[str | None], on_error: str) -> int:
    """One exit status for a chunk from the kinds of its failed tasks: fatal beats transient beats bad input."""
    if any(k == FailureKind.USER or (on_error == RAISE and k != FailureKind.IO) for k in failure_kinds):
        return EXIT_STOP
    if any(k == FailureKind.IO for k in failure_kinds):
        return EXIT_RETRY
    if any(k == FailureKind.INPUT for k in failure_kinds):
        return EXIT_BAD_INPUT
    return EXIT_OK
