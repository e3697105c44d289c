"""RunReport: the outcome of a run, merged from every task's completion marker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from shardflow.errors import JobError
from shardflow.rundir.layout import LAST_RUN, SUMMARY, done_file, errors_file
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.summaries import Block, SpanWriter, read_blocks
from shardflow.rundir.tasks import TaskResult
from shardflow.rundir.tracebacks import TraceCollector, describe_traces, printable
from shardflow.text import safe

_TRACE_LOGS_READ = 20  # error logs read for the report's tracebacks (status reads them all)


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
    shards: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    processed: int = 0  # input samples processed by this run (not by earlier ones)
    interrupted: bool = False
    tracebacks: list[dict[str, Any]] = field(default_factory=list)  # first of each distinct sample error

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

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "tasks": self.tasks, "done": self.done, "skipped": self.skipped,
            "failed": {str(k): v for k, v in sorted(self.failed.items())}, "stats": self.stats.to_json(),
            "shards": self.shards, "seconds": round(self.seconds, 3), "processed": self.processed,
            "interrupted": self.interrupted, "tracebacks": self.tracebacks,
            "ok": self.ok,
        }

    def __str__(self) -> str:
        s = self.stats
        lines = [
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


def build_report(run_dir: RunDir, task_ids: list[int], results: dict[int, TaskResult], started: float,
                 *, skipped: int, interrupted: bool = False) -> RunReport:
    """Merge this run's results with what earlier runs finished, then save summary.json.

    Earlier work is read from per-chunk summaries where they exist and from markers elsewhere (one
    listing of done/, markers fetched in batches); summaries of the SPAN-aligned ranges found whole
    are written on the way, so the next report or status reads O(N / SPAN) files.
    """
    report = RunReport(run_dir.url, len(task_ids), 0, skipped, interrupted=interrupted)
    ids = sorted(task_ids)
    contiguous = ids == list(range(len(ids)))  # as every plan numbers its tasks; summaries need it
    blocks = {first: b for first, b in read_blocks(run_dir, len(ids)).items()
              if not any(t in results for t in _block_ids(b))} if contiguous else {}
    spans = SpanWriter(run_dir, len(ids) if contiguous else 0, ((b.first, b.stop) for b in blocks.values()))
    records = _earlier_records(run_dir, ids, results, blocks)
    pos = 0
    while pos < len(ids):
        task_id = ids[pos]
        block = blocks.get(task_id)
        if block is not None:
            _add_done(report, block.stats, block.shards, block.size)
            spans.add(block.first, block.size, block.stats, block.shards)
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
            stats, outputs = Stats.from_json(records[task_id]["stats"]), records[task_id]["outputs"]
        else:
            continue
        _add_done(report, stats, outputs, 1)
        if contiguous:
            spans.add(task_id, 1, stats, outputs)
    spans.flush()
    report.tracebacks = _this_run_traces(run_dir, results)
    report.seconds = time.perf_counter() - started
    summary = report.to_json()
    run_dir.write_json(SUMMARY, summary)
    run_dir.write_json(LAST_RUN, {k: v for k, v in summary.items() if k != "shards"} | {"shards": len(report.shards)})
    return report


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


def _block_ids(block: Block) -> range:
    return range(block.first, block.stop)


def _add_done(report: RunReport, stats: Stats, outputs: list[dict[str, Any]], count: int) -> None:
    report.done += count
    report.stats.merge(stats)
    report.shards.extend(outputs)


def _earlier_records(run_dir: RunDir, ids: list[int], results: dict[int, TaskResult],
                     blocks: dict[int, Block]) -> dict[int, Any]:
    """Markers of the tasks done before this run that no summary covers (one listing, batched reads)."""
    covered = [False] * len(ids)
    for block in blocks.values():
        covered[block.first:block.stop] = [True] * block.size
    done_before = run_dir.done_ids()
    wanted = [t for i, t in enumerate(ids) if t not in results and not covered[i] and t in done_before]
    return dict(zip(wanted, run_dir.read_many([done_file(t) for t in wanted])))
