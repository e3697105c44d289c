"""Progress lines in pod logs while a task runs: a shard of hours must not look like a hung pod.

`kubectl logs` and Argo's UI show only what the worker prints; the per-task line comes when a task
ends. Between those, every `SHARDFLOW_HEARTBEAT` seconds (default 30; 0 turns it off) the worker
prints samples done in the chunk so far, the rate, and the task it is in.
"""

from __future__ import annotations

import time
from typing import Callable, TextIO

# the interval's one owner: rundir.beats (the same interval refreshes each task's running/ entry)
from shardflow.rundir.beats import heartbeat_seconds


class ChunkHeartbeat:
    """run_task's progress callback for one chunk: counts samples, prints a line now and then."""

    def __init__(self, index: int, tasks: int, log: Callable[[TextIO, str], None], out: TextIO,
                 every: float | None = None) -> None:
        self.index, self.tasks, self._log, self._out = index, tasks, log, out
        self.every = heartbeat_seconds() if every is None else every
        self.started = self.last = time.perf_counter()
        self.samples = 0
        self.task_id: int | None = None
        self.finished = 0

    def start_task(self, task_id: int) -> None:
        self.task_id = task_id

    def end_task(self) -> None:
        self.finished += 1

    def __call__(self, count: int) -> None:
        self.samples += count
        now = time.perf_counter()
        if self.every and now - self.last >= self.every:
            self.last = now
            rate = self.samples / max(now - self.started, 1e-9)
            self._log(self._out, f"index {self.index}: running task {self.task_id} "
                                 f"({self.finished}/{self.tasks} tasks done), {self.samples} samples so far, "
                                 f"{rate:.1f} samples/s, {now - self.started:.0f} s")
