"""Tasks per call: tiny tasks go to a backend in groups, so that its fixed cost per call (for Dask a
graph update, the scheduler's bookkeeping and a result round trip: ~5 ms) is paid once per group.

Each task of a group still runs through run_task alone and is recorded alone (its done marker, its
result, its sample counts); only the number of tasks per call changes. The size follows what the
tasks were measured to take: one task per call until the first results come back (so tasks of
seconds never group, keeping load balancing and per-task retries), then enough tiny tasks to fill
about TARGET_S, but never so many that fewer than GROUPS_PER_THREAD calls per worker thread would
be left to share out (the tail stays balanced, and a lost worker costs one group of tiny tasks).
"""

from __future__ import annotations

from shardflow.errors import JobError
from shardflow.rundir.tasks import Task

TARGET_S = 0.25  # work per call worth ~50x the per-call cost; a task longer than this goes alone
GROUPS_PER_THREAD = 4  # calls per worker thread at least, of what is left
MAX_GROUP = 500  # tasks per call at most (its results travel back together)
_WEIGHT = 0.2  # of the latest measurement in the moving average of a task's seconds


class GroupSizer:
    """How many tasks the next call gets: fixed (`per_call`) or from the measured seconds per task."""

    def __init__(self, per_call: int | None = None) -> None:
        if per_call is not None and (not isinstance(per_call, int) or per_call < 1):
            raise JobError(f"tasks_per_call must be a whole number >= 1 (or None: automatic), not {per_call!r}")
        self.per_call = per_call
        self.task_s: float | None = None  # moving average of a task's seconds on a worker

    def measured(self, seconds: float) -> None:
        """One task took `seconds` on its worker (start to result sent)."""
        seconds = max(0.0, float(seconds))
        self.task_s = seconds if self.task_s is None else (1 - _WEIGHT) * self.task_s + _WEIGHT * seconds

    def size(self, pending: int, threads: int) -> int:
        """Tasks for the next call, with `pending` tasks not yet submitted and `threads` worker threads."""
        if self.per_call is not None:
            return self.per_call
        if self.task_s is None:
            return 1
        by_time = int(TARGET_S / max(self.task_s, 1e-4))
        by_balance = pending // (max(1, threads) * GROUPS_PER_THREAD)
        return max(1, min(by_time, by_balance, MAX_GROUP))


def take_group(remaining: list[Task], size: int, alone: set[int] | frozenset[int]) -> list[Task]:
    """The next group from `remaining` (plan order reversed: the next task is last): up to `size` tasks;
    a task in `alone` (one that killed its worker in a group) goes by itself."""
    group = [remaining.pop()]
    while len(group) < size and group[0].id not in alone and remaining and remaining[-1].id not in alone:
        group.append(remaining.pop())
    return group
