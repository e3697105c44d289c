"""RunReport: the outcome of a run, merged from every task's completion marker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from shardflow.run.rundir import RunDir, task_name
from shardflow.run.stats import Stats
from shardflow.run.task import TaskResult
from shardflow.run.tracebacks import TraceCollector, describe_traces, printable
from shardflow.text import safe

_TRACE_LOGS_READ = 20  # error logs read for the report's tracebacks (status reads them all)


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
    """Merge this run's results with the markers of tasks finished earlier, then save summary.json."""
    report = RunReport(run_dir.url, len(task_ids), 0, skipped, interrupted=interrupted)
    earlier = [t for t in task_ids if t not in results]
    done_before = run_dir.done_ids()
    records = {t: run_dir.read_done(t) for t in earlier if t in done_before}
    for task_id in task_ids:
        result = results.get(task_id)
        if result is not None and result.status == "failed":
            report.failed[task_id] = {"error": result.error, "kind": result.kind}
            continue
        if result is not None:
            stats, outputs = result.stats, result.outputs
            report.processed += stats.samples_in if result.status == "done" else 0
        elif task_id in records:
            stats, outputs = Stats.from_json(records[task_id]["stats"]), records[task_id]["outputs"]
        else:
            continue
        report.done += 1
        report.stats.merge(stats)
        report.shards.extend(outputs)
    report.tracebacks = _this_run_traces(run_dir, results)
    report.seconds = time.perf_counter() - started
    run_dir.write_json("summary.json", report.to_json())
    return report


def _this_run_traces(run_dir: RunDir, results: dict[int, TaskResult]) -> list[dict[str, Any]]:
    """The first traceback of each distinct sample error of the tasks this run finished or failed."""
    ids = [t for t, r in sorted(results.items()) if r.stats.failed or r.status == "failed"][:_TRACE_LOGS_READ]
    collector = TraceCollector()
    for task_id in ids:
        try:
            raw = run_dir.read_bytes(f"errors/{task_name(task_id)}.jsonl").decode()
        except FileNotFoundError:
            continue
        collector.add_all(json.loads(line) for line in raw.splitlines() if line.strip())
    return collector.distinct()
