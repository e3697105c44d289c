"""RunStatus: how far a run got, read from the run directory alone (never the outputs).

This is what `shardflow status RUN_DIR` prints; it works while a run goes on, from any machine that
can read the run directory, and never loads job.pkl (a run directory is code: see docs).

What it costs: the listings of done/ (skipped when summaries cover the plan), records/, running/,
failed/ and errors/ (1,000 names a request on object stores), plan.json and summary.json, and only
the files it shows: the last few failure records and error logs, the beats (rundir.beats: samples,
bytes, parts, the time) of at most BEATS_READ running tasks, lease.json (is a driver still there).
Counts, times and workers come from the records' names (rundir.records, rundir.tally), so a 100k-task
run on S3 costs a few hundred requests in any state (mid-run, markers only, after thousands of pod
summaries).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from shardflow.rundir.beats import STALE_BEATS
from shardflow.rundir.layout import ERRORS, FAILED, LAST_RUN, LEASE, SUMMARY, done_file, failed_file
from shardflow.rundir.lease import describe_holder
from shardflow.rundir.pids import provably_gone
from shardflow.rundir.records import Running, TaskRecord, with_beats
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.tally import IS_DONE, IS_FAILED, RunTally, add_markers, read_tally
from shardflow.rundir.tracebacks import SHOWN_TRACES, TraceCollector, describe_traces, printable
from shardflow.text import safe, safe_repr

FAILED_SHOWN = 20  # failure records read (the last ones; the rest are counted from the listing)
ERROR_LOGS_READ = 100  # error logs read for kinds, examples and tracebacks (the last ones)


@dataclass
class RunStatus:
    """What `shardflow status RUN_DIR` shows; built by `read_status` from the run directory only."""

    run_dir: str
    job: dict[str, Any]
    tasks: int
    done: list[int]
    failed: dict[int, dict[str, Any]]  # task id -> its failed/ record, for the last FAILED_SHOWN failed tasks
    pending: list[int]
    stats: Stats
    shards: int
    error_count: int  # sample errors in the error logs read
    error_kinds: list[tuple[str, int]]  # "stage TypeName" -> count, most common first
    error_examples: list[dict[str, Any]]  # the last dropped samples
    last_run: dict[str, Any] | None  # summary.json of the last run that ended (None: none ended)
    tracebacks: list[dict[str, Any]] = field(default_factory=list)  # first record of each distinct error
    distinct_errors: int = 0
    failed_ids: list[int] = field(default_factory=list)  # every failed task (not done since)
    tally: RunTally | None = None  # records: rate, running tasks, workers (None: markers of an old run only)
    error_logs: tuple[int, int] = (0, 0)  # (read, listed)
    driver_gone: str | None = None  # why no driver runs it any more (driver_gone); None: running, or cannot tell

    @property
    def complete(self) -> bool:
        return len(self.done) == self.tasks

    @property
    def failed_count(self) -> int:
        return len(self.failed_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "job": self.job, "tasks": self.tasks, "done": len(self.done),
            "failed": {str(k): v for k, v in sorted(self.failed.items())}, "failed_ids": self.failed_ids,
            "pending": self.pending, "stats": self.stats.to_json(), "shards": self.shards,
            "errors": self.error_count, "error_kinds": dict(self.error_kinds), "error_examples": self.error_examples,
            "error_logs": {"read": self.error_logs[0], "listed": self.error_logs[1]},
            "last_run": None if self.last_run is None else {
                k: self.last_run.get(k) for k in ("done", "tasks", "processed", "seconds", "interrupted", "ok")},
            "complete": self.complete, "tracebacks": self.tracebacks,
            "progress": None if self.tally is None else progress_json(self.tally),
            "driver_gone": None if self.complete else self.driver_gone,
        }

    def __str__(self) -> str:
        s = self.stats
        name = self.job.get("name") or "?"
        pending = len(self.pending)
        running = len(self.tally.running) if self.tally is not None else 0
        state = "complete" if self.complete else ("has failed tasks" if self.failed_ids else "incomplete")
        lines = [
            f"run {self.run_dir} (job {name}): {state}",
            f"tasks: {self.tasks} in the plan, {len(self.done)} done, {self.failed_count} failed, "
            + (f"{running} running, {pending - running} pending" if running else f"{pending} pending"),
            f"samples (done tasks): {s.samples_in} in, {s.samples_out} out, {s.dropped} dropped, {s.skipped} skipped, "
            f"{s.failed} failed; {self.shards} shards, {s.bytes_out / 1e6:.1f} MB written",
        ]
        lines.extend(_progress_lines(self.tally, gone=bool(self.driver_gone))
                     if self.tally is not None and not self.complete else [])
        if self.driver_gone and not self.complete:
            lines.append(self.driver_gone)
        if s.skip_reasons:
            sampled = self.tally is not None and self.tally.skipping and \
                len(self.tally.skipping) < self.tally.skipping_tasks
            where = f" (in the last {len(self.tally.skipping)} of {self.tally.skipping_tasks} tasks that skipped)" \
                if sampled and self.tally is not None else ""
            lines.append(f"skip reasons{where}: " + ", ".join(f"{k} ({v})" for k, v in s.skip_reasons.most_common(5)))
        if self.error_count:
            kinds = ", ".join(f"{k} ({v})" for k, v in self.error_kinds[:5])
            read, listed = self.error_logs
            where = f" (the last {read} of {listed} tasks' logs)" if read < listed else ""
            lines.append(f"sample errors: {self.error_count} logged in {self.run_dir}/errors/{where}: {kinds}")
            for e in self.error_examples:
                reason = safe(typed_reason(e.get("type"), e.get("reason")), 1000)  # keys, URLs: data
                lines.append(f"  task {e.get('task')} shard {safe(e.get('shard'))} key {safe_repr(e.get('key'))} "
                             f"[{e.get('stage')}] {reason}")
        for task_id, record in list(sorted(self.failed.items()))[-max(len(self.error_examples), 5):]:
            lines.append(f"FAILED task {task_id} [{record.get('kind')}]: {safe(record.get('error'), 2000)}")
        if pending and pending <= 20:
            lines.append("pending tasks: " + ", ".join(map(str, self.pending)))
        if self.last_run is not None:
            lr = self.last_run
            before = lr.get("skipped") or 0
            if lr.get("tasks") and before >= lr["tasks"] and not lr.get("processed"):
                # a no-op rerun or a finalize: "0 samples processed in 0.0 s" read as a run that did nothing
                lines.append(f"last run found all {lr['tasks']} tasks done before it started: nothing to run")
            else:
                lines.append(f"last run ended: {lr.get('done')}/{lr.get('tasks')} tasks done ({before} of them "
                             f"before it), {lr.get('processed')} samples processed in {lr.get('seconds')} s"
                             f"{', interrupted' if lr.get('interrupted') else ''}")
            notes = lr.get("notes")
            lines.extend(f"  {safe(note)}" for note in (notes if isinstance(notes, list) else []))  # --extend, ...
        lines.extend(describe_traces(self.tracebacks, total=self.distinct_errors))
        return printable("\n".join(lines))


def typed_reason(type_name: Any, reason: Any) -> str:
    """"TypeName: reason" for a sample error's log record, its type written once: most reasons
    already start with it (task.failures writes `str(exc)` or `Type: message`)."""
    text = "" if reason is None else str(reason)
    return text if text.startswith(f"{type_name}:") else f"{type_name}: {text}"


def duration(seconds: float) -> str:
    """3 s, 4 min 05 s, 2 h 07 min."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _progress_lines(tally: RunTally, *, gone: bool = False) -> list[str]:
    """Rate, ETA and the running tasks (worker and age), newest first; no ETA when the driver is `gone`."""
    tasks_s, samples_s, bytes_s = tally.rate()
    eta = None if gone else tally.eta()
    lines = [f"rate: {samples_s:.1f} samples/s, {bytes_s / 1e6:.1f} MB/s read, {tasks_s * 60:.1f} tasks/min"
             + (f"; ETA {duration(eta)}" if eta is not None else "")]
    for entry in tally.running[:10]:
        lines.append(f"  {'was running' if gone else 'running'} task {entry.task} on {safe(entry.worker)} for "
                     f"{duration(tally.read_at - entry.start)}{beat_text(entry, tally.read_at)}")
    if len(tally.running) > 10:
        lines.append(f"  ... and {len(tally.running) - 10} more running")
    stale = [r.task for r in tally.running if r.beat is not None and r.beat.stale(tally.read_at)]
    if stale:
        shown = ", ".join(map(str, stale[:20])) + (" ..." if len(stale) > 20 else "")
        lines.append(f"no progress for over {STALE_BEATS} heartbeats in {len(stale)} running tasks "
                     f"(hung or killed?): {shown}")
    return lines


def beat_text(entry: Running, now: float) -> str:
    """What a running task's last beat says: samples so far, rate, parts and the beat's age, or that
    no beat came for STALE_BEATS intervals ("" where no beat was read: an older shardflow's entry)."""
    beat = entry.beat
    if beat is None:
        return ""
    age = max(now - beat.at, 0.0)
    if beat.stale(now):
        why = f"no beat for {duration(age)}" if beat.beats_stopped(now) else "its worker still beats"
        return f": no progress for {duration(beat.idle(now))} (hung or killed?), {beat.samples_in} samples read; {why}"
    if beat.is_first(entry.start):
        return ": no beat yet" if beat.every > 0 else ": heartbeat off"
    return (f": {beat.samples_in} samples read ({beat.rate(entry.start):.1f}/s), {beat.samples_out} written, "
            f"{beat.parts} parts, {beat.bytes_in / 1e6:.1f} MB read; last beat {duration(age)} ago")


def driver_gone(run_dir: RunDir, now: float) -> str | None:
    """Why no driver runs this run any more, where status can tell from lease.json (rundir.lease): its
    process is provably gone (rundir.pids: this host, boot and PID namespace, its pid free), or its lease
    expired (a driver renews it every TTL/3 while it runs). None: a driver holds it, or there is no lease
    (a driver that ended released it, one starting has not taken it yet; pods take none): cannot tell."""
    try:
        record = json.loads(run_dir.read_bytes(LEASE))
        expires = float(record["expires"])
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError):  # not a lease shardflow wrote: nothing to tell
        return None
    if provably_gone(record):
        holder = f"{record.get('user', '?')}@{record['host']} pid {record['pid']}"
        why = f"{holder} ended without releasing the run (killed?)"
    elif expires <= now:
        why = f"{describe_holder(record, now)} renews its lease no more (killed, or stuck)"
    else:
        return None
    return f"driver gone: {safe(why)}; nothing runs the tasks not done: run the same command again to resume"


def progress_json(tally: RunTally) -> dict[str, Any]:
    """tally.to_json() with each running task's last beat (None: not read): status --json, the report."""
    out = tally.to_json()
    for entry, row in zip(tally.running, out["running"]):
        row["beat"] = None if entry.beat is None else entry.beat.to_json(entry.start, tally.read_at)
    return out


def read_status(url: str, storage_options: dict[str, Any] | None = None, *, examples: int = 5,
                traces: int = SHOWN_TRACES, on_record: Callable[[TaskRecord], None] | None = None,
                run_dir: RunDir | None = None) -> RunStatus:
    """Read a run directory (plan, listings, the failures and error logs shown) into a RunStatus.

    `traces`: distinct tracebacks kept; `on_record` sees every task's last record (the report page)."""
    run_dir = run_dir or RunDir(url, storage_options)
    plan = run_dir.load_plan()
    tasks = run_dir.task_count(plan)
    done_ids = {t for t in run_dir.done_ids(tasks) if 0 <= t < tasks}
    tally, unrecorded = read_tally(run_dir, tasks, done_ids, on_record)
    add_markers(tally, zip(unrecorded, run_dir.read_many([done_file(t) for t in unrecorded])))
    stats = tally.stats
    failed_ids = [t for t in _ids(run_dir.list_names(FAILED), ".json") if t < tasks and t not in done_ids]
    for t in failed_ids:  # a failure record written before the record (or by an older shardflow)
        if tally.state[t] != IS_FAILED:
            tally.state[t] = IS_FAILED
    shown = failed_ids[-FAILED_SHOWN:]
    failed = {t: r for t, r in zip(shown, run_dir.read_many([failed_file(t) for t in shown])) if r is not None}
    count, kinds, last, collector, logs = _read_errors(run_dir, examples)
    last_run = _last_run(run_dir)
    done = tally.ids(IS_DONE)
    reasons_from(run_dir, tally, last_run if last_run and last_run.get("done") == len(done) else None)
    failed_set = set(failed_ids)
    pending = [t for t in tally.ids(0) if t not in failed_set]
    tally.running = with_beats(run_dir, tally.running)  # the running tasks' progress (rundir.beats)
    tally.read_at = time.time()
    return RunStatus(run_dir.url, plan.get("job", {}), tasks, done, failed, pending, stats, stats.shards_out,
                     count, kinds.most_common(), last if examples else [], last_run, collector.distinct(traces),
                     len(collector.counts), failed_ids=failed_ids, tally=tally, error_logs=logs,
                     driver_gone=driver_gone(run_dir, tally.read_at) if len(done) < tasks else None)


def reasons_from(run_dir: RunDir, tally: RunTally, last_run: dict[str, Any] | None) -> None:
    """Skip and failure reasons into tally.stats: the summary of a run that ended with every task done
    counts them all; otherwise the markers of the last REASONS_READ tasks that skipped samples (records'
    names hold the counts, not the reasons): tally.skipping_tasks says how many did."""
    stats = tally.stats
    if last_run is not None:
        merged = Stats.from_json(last_run.get("stats") or {})
        stats.skip_reasons, stats.fail_reasons = merged.skip_reasons, merged.fail_reasons
        tally.skipping = []  # all counted
        return
    ids = [t for _, t in sorted(tally.skipping)]
    for marker in run_dir.read_many([done_file(t) for t in ids]):
        if marker is not None:
            stats.skip_reasons.update((marker.get("stats") or {}).get("skip_reasons", {}))


def _last_run(run_dir: RunDir) -> dict[str, Any] | None:
    """last_run.json (a few KB), else (a run dir of an older shardflow) summary.json."""
    for name in (LAST_RUN, SUMMARY):
        try:
            return run_dir.read_json(name)
        except FileNotFoundError:
            continue
    return None


def _ids(names: list[str], suffix: str) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in names if n.endswith(suffix) and n.split(".")[0].isdigit())


def _read_errors(run_dir: RunDir, examples: int) -> tuple[int, Counter, list[dict[str, Any]], TraceCollector,
                                                          tuple[int, int]]:
    """Counts, kinds, the last `examples` records and tracebacks of the last ERROR_LOGS_READ error logs."""
    names = [n for n in run_dir.list_names(ERRORS) if n.endswith(".jsonl")]
    read = names[-ERROR_LOGS_READ:]
    kinds: Counter = Counter()
    last: list[dict[str, Any]] = []
    traces = TraceCollector()
    count = 0
    for raw in run_dir.read_many([f"{ERRORS}/{n}" for n in read], parse=False):
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
    return count, kinds, last, traces, (len(read), len(names))
