"""RunTally: a run's progress counted from the listings of records/ and running/ alone.

Two listings (1,000 names a request on object stores) say which tasks are done, failed or running,
with their counts, times and workers: no marker or summary is opened, so `status` costs O(N / 1,000)
requests at any N and in any state a run leaves (mid-run, markers only, after an Indexed Job's pods
wrote thousands of summaries). Memory stays flat: a byte per task and running sums, never a list
of every record (the report page, which draws every task, keeps compact columns: tools/report_data).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from shardflow.rundir.layout import RECORDS, RUNNING
from shardflow.rundir.records import DONE, Running, TaskRecord, latest, parse_record, parse_running
from shardflow.rundir.stats import Stats

PENDING, IS_DONE, IS_FAILED = 0, 1, 2
_SUMMED = ("samples_in", "samples_out", "dropped", "skipped", "failed", "bytes_in", "bytes_out", "shards_in",
           "shards_out", "seconds")
REASONS_READ = 100  # markers read for skip reasons (the tasks that skipped last), when no summary counts them
RATE_WINDOW_S = 300.0  # the rate and the ETA follow the tasks that ended in the last five minutes


@dataclass
class RunTally:
    """Counts of a plan of `tasks` tasks, from task records."""

    tasks: int
    state: bytearray  # per task: PENDING, IS_DONE or IS_FAILED
    stats: Stats = field(default_factory=Stats)  # summed over done tasks (numbers; reasons are in errors/)
    cpu: float = 0.0  # CPU seconds of the done tasks
    failed_kinds: Counter = field(default_factory=Counter)
    retried: int = 0  # done tasks that needed more than one attempt or an earlier failed run
    first_start: float | None = None
    last_end: float | None = None
    running: list[Running] = field(default_factory=list)  # started, not ended (newest first)
    recent: list[tuple[float, int, int]] = field(default_factory=list)  # (end, samples_in, bytes_in) of the window
    skipping: list[tuple[float, int]] = field(default_factory=list)  # (end, task): the last REASONS_READ with skips
    skipping_tasks: int = 0  # done tasks that skipped samples (their reasons are in their markers)
    read_at: float = field(default_factory=time.time)

    @property
    def done(self) -> int:
        return self.state.count(IS_DONE)

    @property
    def failed(self) -> int:
        return self.state.count(IS_FAILED)

    @property
    def pending(self) -> int:
        return self.tasks - self.done - self.failed

    def ids(self, which: int) -> list[int]:
        return [i for i, s in enumerate(self.state) if s == which]

    def rate(self) -> tuple[float, float, float]:
        """(tasks/s, samples/s, bytes/s read) over the window that ends at the last record read."""
        if not self.recent or self.last_end is None or self.first_start is None:
            return 0.0, 0.0, 0.0
        span = max(min(RATE_WINDOW_S, self.last_end - self.first_start), 1e-3)
        tasks = len(self.recent)
        return tasks / span, sum(r[1] for r in self.recent) / span, sum(r[2] for r in self.recent) / span

    def eta(self) -> float | None:
        """Seconds until every task has ended at the recent rate (None: no rate yet, or nothing left)."""
        per_s = self.rate()[0]
        left = self.pending
        return left / per_s if per_s > 0 and left else None

    def to_json(self) -> dict[str, Any]:
        tasks_s, samples_s, bytes_s = self.rate()
        return {"tasks": self.tasks, "done": self.done, "failed": self.failed, "pending": self.pending,
                "running": [{"task": r.task, "worker": r.worker, "since": round(r.start, 3),
                             "seconds": round(max(self.read_at - r.start, 0.0), 1)} for r in self.running],
                "retried": self.retried, "cpu_seconds": round(self.cpu, 3), "failed_kinds": dict(self.failed_kinds),
                "first_start": self.first_start, "last_end": self.last_end,
                "rate": {"tasks_per_s": round(tasks_s, 4), "samples_per_s": round(samples_s, 2),
                         "bytes_per_s": round(bytes_s)},
                "eta_seconds": None if self.eta() is None else round(self.eta() or 0.0, 1)}


def tally(tasks: int, record_names: Iterable[str], done_ids: set[int] | None = None,
          on_record: Callable[[TaskRecord], None] | None = None) -> RunTally:
    """Count the latest record of each task in [0, tasks); `on_record` sees each (the report's columns).

    With `done_ids` (the markers' listing), a done record without its marker (the worker died between
    the two) counts as not done."""
    out = RunTally(tasks, bytearray(tasks))
    done_records: list[tuple[float, int, int]] = []
    for record in latest(r for r in map(parse_record, record_names) if r is not None and 0 <= r.task < tasks):
        if record.state == DONE and done_ids is not None and record.task not in done_ids:
            continue
        out.first_start = record.start if out.first_start is None else min(out.first_start, record.start)
        out.last_end = record.end if out.last_end is None else max(out.last_end, record.end)
        if record.state == DONE and record.stats is not None:
            out.state[record.task] = IS_DONE
            for name in _SUMMED:  # numbers only: records hold no reasons (Stats.merge would update Counters)
                setattr(out.stats, name, getattr(out.stats, name) + getattr(record.stats, name))
            out.cpu += record.cpu
            out.retried += record.retried
            done_records.append((record.end, record.stats.samples_in, record.stats.bytes_in))
            if record.stats.skipped:
                out.skipping_tasks += 1
                (heapq.heappush if len(out.skipping) < REASONS_READ else heapq.heappushpop)(
                    out.skipping, (record.end, record.task))
            if len(done_records) > 100_000:  # bounded: keep only what may fall in the window
                done_records = _window(done_records, out.last_end)
        else:
            out.state[record.task] = IS_FAILED
            out.failed_kinds[record.kind] += 1
        if on_record is not None:
            on_record(record)
    out.recent = _window(done_records, out.last_end)
    return out


def add_running(out: RunTally, running_names: Iterable[str]) -> None:
    """The tasks started and not ended, newest start first (a killed worker's entry stays: its age says so)."""
    newest: dict[int, Running] = {}
    for entry in filter(None, map(parse_running, running_names)):
        if 0 <= entry.task < out.tasks and out.state[entry.task] == PENDING and (
                entry.task not in newest or entry.start > newest[entry.task].start):
            newest[entry.task] = entry
    out.running = sorted(newest.values(), key=lambda r: -r.start)


def _window(done: list[tuple[float, int, int]], last_end: float | None) -> list[tuple[float, int, int]]:
    if last_end is None:
        return done
    return [r for r in done if r[0] >= last_end - RATE_WINDOW_S]


def read_tally(run_dir: Any, tasks: int, done_ids: set[int],
               on_record: Callable[[TaskRecord], None] | None = None) -> tuple[RunTally, list[int]]:
    """The tally from one listing of records/ (and of running/ while tasks are left), and the done
    tasks that have no record (markers written by an older shardflow: the caller reads those)."""
    out = tally(tasks, run_dir.list_names(RECORDS, tasks=tasks), done_ids, on_record)
    unrecorded = sorted(t for t in done_ids if 0 <= t < tasks and out.state[t] != IS_DONE)
    if out.pending > len(unrecorded):
        add_running(out, run_dir.list_names(RUNNING))
    return out, unrecorded


def add_markers(out: RunTally, markers: Iterable[tuple[int, dict[str, Any] | None]]) -> None:
    """Count done tasks from their markers (those without a record): their stats, no times."""
    for task_id, marker in markers:
        if marker is None:
            continue
        if out.state[task_id] == IS_FAILED:
            out.failed_kinds.subtract(["?"])
        out.state[task_id] = IS_DONE
        out.stats.merge(Stats.from_json(marker.get("stats", {})))
    out.failed_kinds = +out.failed_kinds
