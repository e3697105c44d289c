"""RunReport: the outcome of a run, merged from every task's completion marker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Sequence

from shardflow.errors import JobError
from shardflow.rundir.layout import LAST_RUN, SUMMARY, done_file, errors_file
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.shard_entries import ShardEntries
from shardflow.rundir.stats import Stats
from shardflow.rundir.summaries import SpanWriter, Summary, numbered_from_zero, read_summaries
from shardflow.rundir.summary_json import summary_chunks
from shardflow.rundir.tasks import TaskResult
from shardflow.rundir.tracebacks import TraceCollector, describe_traces, printable
from shardflow.text import safe

_TRACE_LOGS_READ = 20  # error logs read for the report's tracebacks (status reads them all)
MARKER_WINDOW = 250  # markers read at a time (concurrently on object stores); divides SPAN


class RunFailed(JobError):
    """A run that did not finish every task (`RunReport.raise_for_failures`); `.report` is the report."""

    def __init__(self, message: str, report: "RunReport | None" = None, **location: Any) -> None:
        super().__init__(message, **location)
        self.report = report  # None after crossing a process boundary


@dataclass
class RunReport:
    """Totals over all tasks of the plan (including ones finished by earlier runs)."""

    run_dir: str
    tasks: int
    done: int
    skipped: int  # already finished before this run started
    failed: dict[int, dict[str, Any]] = field(default_factory=dict)  # task id -> {"error", "kind"}
    stats: Stats = field(default_factory=Stats)
    shards: Sequence[dict[str, Any]] = field(default_factory=list)  # in task order; a ShardEntries from build_report
    seconds: float = 0.0
    processed: int = 0  # input samples processed by this run (not by earlier ones)
    interrupted: bool = False
    tracebacks: list[dict[str, Any]] = field(default_factory=list)  # first of each distinct sample error
    notes: list[str] = field(default_factory=list)  # what the run did to its plan first (job.rerun.Prepared)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and self.done == self.tasks

    def raise_for_failures(self) -> "RunReport":
        """Raise RunFailed unless every task is done (a script's exit status then says so); returns self.

        Failed samples under on_error="skip" are not failures of the run (the report counts them); a
        failed task, an interrupted run or tasks left undone are."""
        if self.ok:
            return self
        problems = []
        if self.failed:
            task_id, first = min(self.failed.items())
            problems.append(f"{len(self.failed)} tasks failed (first: task {task_id} [{first.get('kind')}]: "
                            f"{safe(first.get('error'), 500)})")
        if self.interrupted:
            problems.append("interrupted")
        left = self.tasks - self.done - len(self.failed)
        if left > 0:
            problems.append(f"{left} tasks not run")
        raise RunFailed(f"run {self.run_dir}: {self.done}/{self.tasks} tasks done; " + "; ".join(problems)
                        + f" (shardflow status {self.run_dir})", self)

    def to_json(self, *, shards: bool = True) -> dict[str, Any]:
        """The report as summary.json holds it; without `shards`, all but the shard entries (what
        build_report streams after it, and last_run.json)."""
        return {
            "run_dir": self.run_dir, "tasks": self.tasks, "done": self.done, "skipped": self.skipped,
            "failed": {str(k): v for k, v in sorted(self.failed.items())}, "stats": self.stats.to_json(),
            **({"shards": list(self.shards)} if shards else {}), "seconds": round(self.seconds, 3),
            "processed": self.processed, "interrupted": self.interrupted, "tracebacks": self.tracebacks,
            "ok": self.ok, **({"notes": list(self.notes)} if self.notes else {}),
        }

    def __str__(self) -> str:
        s = self.stats
        lines = [*self.notes,
            f"run {self.run_dir}: {self.done}/{self.tasks} tasks done ({self.skipped} already done before), "
            f"{len(self.failed)} failed{', interrupted' if self.interrupted else ''}",
            f"samples: {s.samples_in} in, {s.samples_out} out, {s.dropped} dropped, {s.skipped} skipped, "
            f"{s.failed} failed; {len(self.shards)} shards, {s.bytes_out / 1e6:.1f} MB written",
            f"this run: {self.processed} samples in {self.seconds:.1f} s"
            + (f" ({self.processed / self.seconds:.0f} samples/s)" if self.seconds and self.processed else ""),
        ]
        if s.skip_reasons:
            lines.append("skip reasons: " + ", ".join(f"{k} ({v})" for k, v in s.skip_reasons.most_common(5)))
        if s.fail_reasons:
            lines.append("sample failures: " + ", ".join(f"{k} ({v})" for k, v in s.fail_reasons.most_common(5))
                         + f"; see {self.run_dir}/errors/")
        for task_id, failure in sorted(self.failed.items())[:10]:
            lines.append(f"FAILED task {task_id} [{failure.get('kind')}]: {safe(failure.get('error'), 2000)}")
        if len(self.failed) > 10:
            lines.append(f"... and {len(self.failed) - 10} more failed tasks (shardflow status {self.run_dir})")
        lines.extend(describe_traces(self.tracebacks))
        return printable("\n".join(lines))


def build_report(run_dir: RunDir, task_ids: list[int] | range, results: dict[int, TaskResult], started: float,
                 *, skipped: int, interrupted: bool = False, written: Collection[int] = frozenset(),
                 notes: Sequence[str] = ()) -> RunReport:
    """Merge this run's results with what earlier runs finished, then save summary.json.

    Earlier work is read from per-chunk summaries where they exist and from markers elsewhere (one
    listing of done/, MARKER_WINDOW markers fetched at a time); summaries of the SPAN-aligned ranges found
    whole are written on the way, so the next report or status reads O(N / SPAN) files. Memory stays
    flat at any N: summaries are read a few at a time and kept as references (report.shards is a
    ShardEntries), and summary.json is written as a stream. `written`: the SPAN ranges whose summary
    this run already wrote (LiveSpans), not written again. `notes`: what the run did to its plan first
    (job.rerun.Prepared), kept in the report and in last_run.json.
    """
    report = RunReport(run_dir.url, len(task_ids), 0, skipped, interrupted=interrupted, notes=list(notes))
    entries = report.shards = ShardEntries(run_dir)
    ids = task_ids if isinstance(task_ids, range) and task_ids.step == 1 else sorted(task_ids)
    contiguous = numbered_from_zero(ids)
    total = len(ids)
    summaries = read_summaries(run_dir, total, skip=lambda f, s: any(t in results for t in range(f, s)),
                               keep_shards=lambda f, s: SpanWriter.merges(f, s, total)) if contiguous else iter(())
    ahead = _Ahead(summaries)
    spans = SpanWriter(run_dir, total if contiguous else 0, entries.append, written)
    add = spans.add if contiguous else (lambda first, size, stats, piece, kept=False: entries.append(piece))
    done_before = _Lazy(run_dir.done_ids)  # listed only if some done task is left that no summary covers
    records: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    pos, window_end = 0, 0
    while pos < total:
        if pos >= window_end:  # the markers of the next positions that no summary covers, in one batch
            window_end, records = pos - pos % MARKER_WINDOW + MARKER_WINDOW, {}
            records = _window_records(run_dir, ids, pos, window_end, results, done_before, ahead.until(window_end))
        task_id = ids[pos]
        block = ahead.pop(task_id) if contiguous else None
        if block is not None:
            _add_done(report, block.stats, block.size)
            add(block.first, block.size, block.stats, block)
            pos += block.size
            continue
        pos += 1
        result = results.get(task_id)
        if result is not None and result.status == "failed":
            report.failed[task_id] = {"error": result.error, "kind": result.kind}
            continue
        if result is not None:
            stats, outputs = result.stats, result.outputs
            report.processed += stats.samples_in if result.status == "done" else 0
        elif records.get(task_id) is not None:
            stats, outputs = Stats.from_json(records[task_id][0]), records[task_id][1]
        else:
            continue
        _add_done(report, stats, 1)
        add(task_id, 1, stats, outputs, kept=result is not None)  # this run's outputs stay as returned
    spans.flush()
    del records, done_before  # nothing of the markers is kept while summary.json is written
    report.tracebacks = _this_run_traces(run_dir, results)
    report.seconds = time.perf_counter() - started
    head = report.to_json(shards=False)
    run_dir.write_chunks(SUMMARY, summary_chunks(head, entries))
    run_dir.write_json(LAST_RUN, head | {"shards": len(entries)})
    return report


class _Ahead:
    """The summaries of a read_summaries stream, pulled in order as far as a window needs them."""

    def __init__(self, summaries: Iterator[Summary]) -> None:
        self._stream = summaries
        self._pulled: dict[int, Summary] = {}
        self._next: Summary | None = next(summaries, None)

    def until(self, stop: int) -> dict[int, Summary]:
        """The summaries not yet popped that start before `stop`, by first task."""
        while self._next is not None and self._next.first < stop:
            self._pulled[self._next.first] = self._next
            self._next = next(self._stream, None)
        return self._pulled

    def pop(self, first: int) -> Summary | None:
        return self._pulled.pop(first, None)


class _Lazy:
    """A value made on first use (the done set: a listing of done/ and a million ints at 1M tasks)."""

    def __init__(self, make: Callable[[], set[int]]) -> None:
        self._make = make
        self._value: set[int] | None = None

    def get(self) -> set[int]:
        if self._value is None:
            self._value = self._make()
        return self._value


def _window_records(run_dir: RunDir, ids: Sequence[int], pos: int, stop: int, results: dict[int, TaskResult],
                    done_before: _Lazy, blocks: dict[int, Summary]) -> dict[int, tuple[dict, list]]:
    """Markers of the tasks at positions [pos, stop) done before this run that no summary covers."""
    stop = min(stop, len(ids))
    covered = set()
    for block in blocks.values():
        covered.update(range(max(block.first, pos), min(block.stop, stop)))
    left = [t for t in (ids[i] for i in range(pos, stop) if i not in covered) if t not in results]
    wanted = [t for t in left if t in done_before.get()] if left else []
    return {t: (r["stats"], r["outputs"]) for t, r in zip(wanted, run_dir.read_many([done_file(t) for t in wanted]))
            if r is not None}  # the rest of a marker (inputs, its record) is not kept


def _this_run_traces(run_dir: RunDir, results: dict[int, TaskResult]) -> list[dict[str, Any]]:
    """The first traceback of each distinct sample error of the tasks this run finished or failed."""
    ids = [t for t, r in sorted(results.items()) if r.stats.failed or r.status == "failed"][:_TRACE_LOGS_READ]
    collector = TraceCollector()
    for task_id in ids:
        try:
            raw = run_dir.read_bytes(errors_file(task_id)).decode()
        except FileNotFoundError:
            continue
        collector.add_all(json.loads(line) for line in raw.splitlines() if line.strip())
    return collector.distinct()


def _add_done(report: RunReport, stats: Stats, count: int) -> None:
    report.done += count
    report.stats.merge(stats)
