"""The numbers of the report page (`shardflow report`, and its `--json`), from the run directory alone.

Everything comes from what `status` reads (listings of the run directory, the failure records and
error logs it shows, plan.json, job.json, summary.json) plus, per task, the record in its name
(rundir.records): start, duration, CPU, counts, worker. Series are computed here with numpy, so the
page and `--json` show the same numbers; the page only draws them (tools/report_plots).
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from shardflow.rundir.layout import JOB_RECORD
from shardflow.rundir.records import DONE, TaskRecord, host_of
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.status import RunStatus, progress_json, read_status
from shardflow.version import __version__

BINS = 60  # points of the time series
DURATION_BINS = 30
SLOWEST = 10
DISTINCT_ERRORS = 20


class Columns:
    """Every task's last record as compact columns (the page draws every task; 100k tasks ~ 6 MB)."""

    def __init__(self) -> None:
        self.task: list[int] = []
        self.done: list[bool] = []
        self.start: list[float] = []
        self.seconds: list[float] = []
        self.cpu: list[float] = []
        self.samples: list[int] = []
        self.bytes_in: list[int] = []
        self.bytes_out: list[int] = []
        self.worker: list[int] = []
        self.attempts: list[int] = []
        self.workers: dict[str, int] = {}

    def add(self, record: TaskRecord) -> None:
        stats = record.stats
        self.task.append(record.task)
        self.done.append(record.state == DONE)
        self.start.append(record.start)
        self.seconds.append(record.seconds)
        self.cpu.append(record.cpu)
        self.samples.append(stats.samples_in if stats else 0)
        self.bytes_in.append(stats.bytes_in if stats else 0)
        self.bytes_out.append(stats.bytes_out if stats else 0)
        self.worker.append(self.workers.setdefault(record.worker, len(self.workers)))
        self.attempts.append(record.attempts)


def collect(url: str, storage_options: dict[str, Any] | None = None, *,
            run_dir: RunDir | None = None) -> dict[str, Any]:
    """The report's numbers (JSON-safe) for the run directory at `url`."""
    run_dir = run_dir or RunDir(url, storage_options)
    columns = Columns()
    status = read_status(url, storage_options, examples=5, traces=DISTINCT_ERRORS, on_record=columns.add,
                         run_dir=run_dir)
    plan = run_dir.load_plan()
    try:
        job_record = run_dir.read_json(JOB_RECORD)
    except FileNotFoundError:
        job_record = {}
    arrays = {name: np.asarray(getattr(columns, name), dtype=float)
              for name in ("task", "start", "seconds", "cpu", "samples", "bytes_in", "bytes_out", "worker", "attempts")}
    done = np.asarray(columns.done, dtype=bool)
    return {
        "run_dir": status.run_dir,
        "job": status.job.get("name"),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "shardflow_version": __version__,
        "summary": _summary(status, arrays, done),
        "settings": plan.get("settings") or {},
        "job_settings": status.job,
        "code": plan.get("code") or {},
        "versions": job_record.get("versions") or {},
        "timeline": _timeline(arrays, done, status),
        "durations": _durations(arrays, done, run_dir, plan),
        "workers": _workers(arrays, done, columns.workers),
        "failures": _failures(status),
        "sample_errors": _sample_errors(status),
        "dropped": _dropped(status),
        "running": [] if status.tally is None else progress_json(status.tally)["running"][:50],  # with beats
        "driver_gone": status.driver_gone,  # rundir.status.driver_gone: killed, or its lease expired
    }


def _summary(status: RunStatus, a: dict[str, np.ndarray], done: np.ndarray) -> dict[str, Any]:
    s, tally = status.stats, status.tally
    ends = a["start"] + a["seconds"]
    wall = float(ends.max() - a["start"].min()) if len(ends) else 0.0
    return {
        "tasks": status.tasks, "done": len(status.done), "failed": status.failed_count,
        "running": 0 if tally is None else len(tally.running), "pending": len(status.pending),
        "retried": 0 if tally is None else tally.retried,
        "inputs": s.shards_in, "outputs": s.shards_out, "samples_in": s.samples_in, "samples_out": s.samples_out,
        "dropped": s.dropped, "skipped": s.skipped, "failed_samples": s.failed, "bytes_in": s.bytes_in,
        "bytes_out": s.bytes_out, "wall_seconds": round(wall, 3), "task_seconds": round(float(a["seconds"].sum()), 3),
        "cpu_seconds": round(float(a["cpu"][done].sum()), 3),
        "samples_per_s": round(s.samples_in / wall, 2) if wall > 0 else None,
        "complete": status.complete, "first_done": status.done[:3],
    }


def _timeline(a: dict[str, np.ndarray], done: np.ndarray, status: RunStatus) -> dict[str, Any]:
    """Samples/s, MB/s (read and written) and tasks running, in BINS intervals from the first start
    to the last end. A task's samples and bytes are spread evenly over its duration."""
    if not len(a["start"]):
        return {"t": [], "samples_per_s": [], "mb_in_per_s": [], "mb_out_per_s": [], "running": [], "t0": None}
    start, end = a["start"], a["start"] + a["seconds"]
    t0, t1 = float(start.min()), float(end.max())
    edges = np.linspace(t0, max(t1, t0 + 1e-3), BINS + 1)
    width = edges[1] - edges[0]

    def rate(values: np.ndarray) -> np.ndarray:
        duration = np.maximum(end - start, 1e-6)
        # part of each task done by each edge: clip((edge - start) / duration, 0, 1), summed, differenced
        done_by = np.array([float((values * np.clip((e - start) / duration, 0, 1)).sum()) for e in edges])
        return np.diff(done_by) / width

    ok = done.astype(float)
    mids = (edges[:-1] + edges[1:]) / 2
    # tasks running, averaged over each interval: task-seconds spent in it / its width (short tasks count)
    busy = np.array([float(np.clip(e - start, 0, end - start).sum()) for e in edges])
    return {
        "t0": t0, "t": [round(float(m - t0), 3) for m in mids],
        "samples_per_s": _round(rate(a["samples"] * ok)),
        "mb_in_per_s": _round(rate(a["bytes_in"] * ok) / 1e6),
        "mb_out_per_s": _round(rate(a["bytes_out"] * ok) / 1e6),
        "running": _round(np.diff(busy) / width),
    }


def _round(values: np.ndarray) -> list[float]:
    return [round(float(v), 3) for v in values]


def _durations(a: dict[str, np.ndarray], done: np.ndarray, run_dir: RunDir, plan: dict[str, Any]) -> dict[str, Any]:
    seconds = a["seconds"][done]
    if not len(seconds):
        return {"edges": [], "counts": [], "slowest": [], "median": None, "p95": None}
    counts, edges = np.histogram(seconds, bins=min(DURATION_BINS, max(1, len(seconds))))
    order = np.argsort(-a["seconds"] * done)[:SLOWEST]
    slow_ids = [int(a["task"][i]) for i in order if done[i]]
    inputs = {t.id: list(t.inputs) for t in run_dir.load_tasks(plan, sorted(slow_ids))}
    slowest = [{"task": int(a["task"][i]), "seconds": round(float(a["seconds"][i]), 3),
                "samples": int(a["samples"][i]), "worker_index": int(a["worker"][i]),
                "inputs": inputs.get(int(a["task"][i]), [])} for i in order if done[i]]
    return {"edges": _round(edges), "counts": [int(c) for c in counts], "slowest": slowest,
            "median": round(float(np.median(seconds)), 3), "p95": round(float(np.percentile(seconds, 95)), 3)}


def _workers(a: dict[str, np.ndarray], done: np.ndarray, names: dict[str, int]) -> dict[str, Any]:
    """Per worker and per host: tasks, samples, MB read, busy seconds and samples per busy second."""
    by_worker: dict[str, list[float]] = {}
    by_host: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
    index_name = {i: n for n, i in names.items()}
    worker = a["worker"].astype(int)
    ok = done.astype(float)
    sums = [np.bincount(worker, weights=w, minlength=len(names)) for w in
            (ok, a["samples"] * ok, a["bytes_in"] * ok, a["seconds"] * ok, a["cpu"] * ok)]
    for i in range(len(names)):
        row = [float(column[i]) for column in sums]
        by_worker[index_name[i]] = row
        host = by_host[host_of(index_name[i])]
        for k in range(5):
            host[k] += row[k]

    def rows(table: dict[str, list[float]]) -> list[dict[str, Any]]:
        out = [{"name": n, "tasks": int(r[0]), "samples": int(r[1]), "mb_in": round(r[2] / 1e6, 3),
                "busy_seconds": round(r[3], 3), "cpu_seconds": round(r[4], 3),
                "samples_per_busy_s": round(r[1] / r[3], 2) if r[3] > 0 else None} for n, r in table.items()]
        return sorted(out, key=lambda r: -r["samples"])

    return {"workers": rows(by_worker), "hosts": rows(dict(by_host)),
            "names": [index_name[i] for i in range(len(names))]}


_VARIABLE = re.compile(r"(shard \S+|key '[^']*'|key \"[^\"]*\"|\d+)")


def _failures(status: RunStatus) -> dict[str, Any]:
    """Failed tasks by kind (all, from the listing) and by distinct error (the records read)."""
    by_kind: Counter = Counter(str(r.get("kind")) for r in status.failed.values())
    if status.tally is not None and status.tally.failed_kinds:
        by_kind = Counter({str(k): v for k, v in status.tally.failed_kinds.items()})
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for task_id, record in sorted(status.failed.items()):
        error = str(record.get("error"))
        key = (str(record.get("kind")), _VARIABLE.sub("#", error)[:300])
        group = groups.setdefault(key, {"kind": key[0], "error": error, "count": 0, "tasks": [],
                                        "example_task": task_id, "inputs": record.get("inputs", [])})
        group["count"] += 1
        group["tasks"].append(task_id)
    return {"count": status.failed_count, "read": len(status.failed), "by_kind": dict(by_kind),
            "distinct": sorted(groups.values(), key=lambda g: -g["count"])}


def _sample_errors(status: RunStatus) -> dict[str, Any]:
    return {"count": status.error_count, "logs_read": status.error_logs[0], "logs": status.error_logs[1],
            "by_kind": [[k, v] for k, v in status.error_kinds],
            "distinct": [{k: t.get(k) for k in ("count", "stage", "type", "reason", "key", "shard", "task", "trace")}
                         for t in status.tracebacks], "distinct_total": status.distinct_errors}


def _dropped(status: RunStatus) -> dict[str, Any]:
    s = status.stats
    sampled = status.tally is not None and 0 < len(status.tally.skipping) < status.tally.skipping_tasks
    return {"filtered": s.dropped, "skipped": s.skipped, "skip_reasons": dict(s.skip_reasons.most_common()),
            "failed": s.failed, "fail_reasons": dict(s.fail_reasons.most_common()),
            "reasons_sampled": bool(sampled)}
