"""A progress bar for runs: tasks done, samples/s and errors, fed by every backend the same way."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from shardflow.run.task import TaskResult


class Progress:
    """Counts finished tasks and processed samples; draws a tqdm bar when asked to."""

    def __init__(self, total: int, initial: int, *, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.samples = 0
        self.failed_tasks = 0
        self.sample_errors = 0
        self._started = time.perf_counter()
        self._bar = tqdm(total=total, initial=initial, unit="task", disable=not enabled, dynamic_ncols=True)

    def add_samples(self, count: int) -> None:
        self.samples += count
        self._refresh()

    def task_finished(self, result: TaskResult) -> None:
        if result.status == "failed":
            self.failed_tasks += 1
        self.sample_errors += result.stats.failed
        self._bar.update(1)
        self._refresh()

    def _refresh(self) -> None:
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        self._bar.set_postfix(
            {"samples/s": f"{self.samples / elapsed:.0f}", "failed tasks": self.failed_tasks,
             "bad samples": self.sample_errors},
            refresh=False,
        )

    def close(self) -> None:
        self._bar.close()
