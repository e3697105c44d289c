"""RunStatus: how far a run got, read from the run directory alone (never the outputs).

This is what `shardflow status RUN_DIR` prints; it works while a run goes on, from any machine that
can read the run directory, and never loads job.pkl (a run directory is code: see docs).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shardflow.rundir.layout import SUMMARY, failed_file
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.summaries import merged_done
from shardflow.rundir.tracebacks import TraceCollector, describe_traces, printable
from shardflow.text import safe, safe_repr


@dataclass
class RunStatus:
    """What `shardflow status RUN_DIR` shows; built by `read_status` from the run directory only."""

    run_dir: str
    job: dict[str, Any]
    tasks: int
    done: list[int]
    failed: dict[int, dict[str, Any]]  # task id -> its failed/ record (tasks not done since)
    pending: list[int]
    stats: Stats
    shards: int
    error_count: int
    error_kinds: list[tuple[str, int]]  # "stage TypeName" -> count, most common first
    error_examples: list[dict[str, Any]]  # the last dropped samples
    last_run: dict[str, Any] | None  # summary.json of the last run that ended (None: none ended)
    tracebacks: list[dict[str, Any]] = field(default_factory=list)  # first record of each distinct error
    distinct_errors: int = 0

    @property
    def complete(self) -> bool:
        return len(self.done) == self.tasks

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "job": self.job, "tasks": self.tasks, "done": len(self.done),
            "failed": {str(k): v for k, v in sorted(self.failed.items())}, "pending": self.pending,
            "stats": self.stats.to_json(), "shards": self.shards, "errors": self.error_count,
            "error_kinds": dict(self.error_kinds), "error_examples": self.error_examples,
            "last_run": None if self.last_run is None else {
                k: self.last_run.get(k) for k in ("done", "tasks", "processed", "seconds", "interrupted", "ok")},
            "complete": self.complete, "tracebacks": self.tracebacks,
        }

    def __str__(self) -> str:
        s = self.stats
        name = self.job.get("name") or "?"
        pending = len(self.pending)
        state = "complete" if self.complete else ("has failed tasks" if self.failed else "incomplete")
        lines = [
            f"run {self.run_dir} (job {name}): {state}",
            f"tasks: {self.tasks} in the plan, {len(self.done)} done, {len(self.failed)} failed, {pending} pending",
            f"samples (done tasks): {s.samples_in} in, {s.samples_out} out, {s.dropped} dropped, {s.skipped} skipped, "
            f"{s.failed} failed; {self.shards} shards, {s.bytes_out / 1e6:.1f} MB written",
        ]
        if s.skip_reasons:
            lines.append("skip reasons: " + ", ".join(f"{k} ({v})" for k, v in s.skip_reasons.most_common(5)))
        if self.error_count:
            kinds = ", ".join(f"{k} ({v})" for k, v in self.error_kinds[:5])
            lines.append(f"sample errors: {self.error_count} logged in {self.run_dir}/errors/: {kinds}")
            for e in self.error_examples:
                reason = safe(e.get("reason"), 1000)  # names, keys and URLs in it are data
                if not reason.startswith(f"{e.get('type')}:"):
                    reason = f"{e.get('type')}: {reason}"
                lines.append(f"  task {e.get('task')} shard {safe(e.get('shard'))} key {safe_repr(e.get('key'))} "
                             f"[{e.get('stage')}] {reason}")
        for task_id, record in list(sorted(self.failed.items()))[-max(len(self.error_examples), 5):]:
            lines.append(f"FAILED task {task_id} [{record.get('kind')}]: {safe(record.get('error'), 2000)}")
        if pending and pending <= 20:
            lines.append("pending tasks: " + ", ".join(map(str, self.pending)))
        if self.last_run is not None:
            lr = self.last_run
            lines.append(f"last run ended: {lr.get('done')}/{lr.get('tasks')} tasks done, "
                         f"{lr.get('processed')} samples "
                         f"processed in {lr.get('seconds')} s{', interrupted' if lr.get('interrupted') else ''}")
        lines.extend(describe_traces(self.tracebacks, total=self.distinct_errors))
        return printable("\n".join(lines))


def read_status(url: str, storage_options: dict[str, Any] | None = None, *, examples: int = 5) -> RunStatus:
    """Read a run directory (plan, markers, failures, error logs) into a RunStatus; never reads outputs."""
    run_dir = RunDir(url, storage_options)
    plan = run_dir.load_plan()
    task_ids = list(range(run_dir.task_count(plan)))
    done_ids = run_dir.done_ids() & set(task_ids)
    failed_ids = (run_dir.failed_ids() & set(task_ids)) - done_ids
    stats, shards = merged_done(run_dir, len(task_ids), done_ids)  # summaries, markers where none
    failed = {}
    for task_id, record in zip(sorted(failed_ids),
                               _read_many(run_dir, [failed_file(t) for t in sorted(failed_ids)])):
        if record is not None:
            failed[task_id] = record
    error_names = [n for n in run_dir.list_names("errors") if n.endswith(".jsonl")]
    kinds: Counter = Counter()
    last: list[dict[str, Any]] = []
    traces = TraceCollector()
    count = 0
    for raw in _read_many(run_dir, [f"errors/{n}" for n in error_names], parse=False):
        for line in () if raw is None else raw.splitlines():
            if not line.strip():
                continue
            error = json.loads(line)
            count += 1
            traces.add(error)
            kinds[f"{error.get('stage')} {error.get('type')}"] += 1
            last.append(error)
            if len(last) > examples:
                last.pop(0)
    last_run = run_dir.read_json(SUMMARY) if run_dir.exists(SUMMARY) else None
    pending = [t for t in task_ids if t not in done_ids and t not in failed_ids]
    return RunStatus(run_dir.url, plan.get("job", {}), len(task_ids), sorted(done_ids), failed, pending, stats,
                     shards, count, kinds.most_common(), last if examples else [], last_run,
                     traces.distinct(), len(traces.counts))


def _read_many(run_dir: RunDir, names: list[str], *, parse: bool = True) -> list[Any]:
    """Contents of several run-dir files, in order (see RunDir.read_many)."""
    return run_dir.read_many(names, parse=parse)
