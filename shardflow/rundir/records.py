"""Task records: what each task did, kept in the NAMES of empty files so a listing reads them all.

    records/000017.d.<attempts>.<start_ms>.<ms>.<cpu_ms>.<in>.<out>.<dropped>.<skipped>.<failed>
            .<bytes_in>.<bytes_out>.<shards_in>.<shards_out>.<worker>   task 17 done (written just before its marker)
    records/000017.f.<attempts>.<start_ms>.<ms>.<cpu_ms>.<kind>.<worker>   task 17 failed
    running/000017.<start_ms>.<worker>                          task 17 started there (removed when it ends)

Why names: `status`, `status --watch` and the report page need every task's times, counts and worker
to draw throughput, tasks running over time and per-worker rates, and a LIST returns 1,000 names per
request where reading 1,000 markers costs 1,000 GETs (100k tasks: 100 LISTs instead of 100,000 GETs).
A done record is written before the marker, so a task whose marker exists has its record; a record
whose marker never came (the worker died in between) is superseded by the rerun's record (the latest
start wins). Reruns of a task leave one record per attempt run; readers keep the last.
The worker name is the host (a pod's name on Kubernetes) plus the Slurm array job/task when set,
and the pid: the report groups throughput by it and by host.
A running/ entry's CONTENT is the task's last beat (rundir.beats: samples, bytes, parts, the time),
written when it starts and replaced every heartbeat interval while it runs: status reads it for the
running tasks it shows (a GET each), the listings stay names only.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

from shardflow.errors import ShardIOError
from shardflow.rundir.beats import BEATS_READ, Beat, heartbeat_seconds, parse_beat, start_beats, stop_beats
from shardflow.rundir.layout import RECORDS, RUNNING, task_name
from shardflow.rundir.stats import Stats
from shardflow.storage.atomic import in_new_folders
from shardflow.storage.paths import is_local

DONE, FAILED = "d", "f"
_STAT_FIELDS = ("samples_in", "samples_out", "dropped", "skipped", "failed", "bytes_in", "bytes_out", "shards_in",
                "shards_out")
_WORKER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_~")


def _clean(text: str, limit: int) -> str:
    """A name part: only letters, digits, - _ ~ (a dot separates fields), at most `limit` characters."""
    return "".join(c if c in _WORKER_CHARS else "-" for c in text)[:limit] or "unknown"


def worker_name(environ: dict[str, str] | None = None, pid: int | None = None) -> str:
    """This process's worker name: host[~slurm<job>_<task>]~p<pid> (the host is the pod's name on k8s)."""
    env = os.environ if environ is None else environ
    host = env.get("SHARDFLOW_WORKER_HOST") or socket.gethostname()
    parts = [_clean(host.split(".")[0] if not host.replace(".", "").isdigit() else host, 60)]
    if env.get("SLURM_ARRAY_JOB_ID"):
        parts.append(_clean(f"slurm{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}", 30))
    elif env.get("JOB_COMPLETION_INDEX"):  # an Indexed Job's pod (its hostname says it too)
        parts.append(_clean(f"index{env['JOB_COMPLETION_INDEX']}", 20))
    parts.append(f"p{os.getpid() if pid is None else pid}")
    return "~".join(parts)


_WORKER: tuple[int, str] | None = None


def _this_worker() -> str:
    """worker_name() of this process, made once per pid (a forked worker makes its own)."""
    global _WORKER
    if _WORKER is None or _WORKER[0] != os.getpid():
        _WORKER = (os.getpid(), worker_name())
    return _WORKER[1]


def host_of(worker: str) -> str:
    """The host part of a worker name."""
    return worker.split("~", 1)[0]


def pid_of(worker: str) -> int | None:
    """The pid at the end of a worker name (`...~p<pid>`, worker_name), None when it names none."""
    tail = worker.rsplit("~p", 1)[-1]
    return int(tail) if tail.isdigit() else None


@dataclass
class TaskRecord:
    """One task's last run: when, how long, how much, where; a failure's kind."""

    task: int
    state: str  # DONE | FAILED
    attempts: int
    start: float  # seconds since the epoch
    seconds: float
    cpu: float
    worker: str
    stats: Stats | None = None  # DONE only (counts; no per-reason counters: those are in errors/ and summaries)
    kind: str | None = None  # FAILED only
    runs: int = 1  # records of this task found (a task failed in one run and done in a later one: 2)

    @property
    def retried(self) -> bool:
        """Needed more than one try: I/O retries within a run, or an earlier run that failed or died."""
        return self.attempts > 1 or self.runs > 1

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def name(self) -> str:
        head = [task_name(self.task), self.state, str(self.attempts), str(round(self.start * 1000)),
                str(round(self.seconds * 1000)), str(round(self.cpu * 1000))]
        if self.state == DONE:
            stats = self.stats or Stats()
            head.extend(str(int(getattr(stats, f))) for f in _STAT_FIELDS)
        else:
            head.append(_clean(str(self.kind), 20))
        return ".".join(head + [_clean(self.worker, 120)])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task, "state": self.state, "attempts": self.attempts,
                               "start": round(self.start, 3), "seconds": round(self.seconds, 3),
                               "cpu": round(self.cpu, 3), "worker": self.worker}
        if self.stats is not None:
            out.update({f: getattr(self.stats, f) for f in _STAT_FIELDS})
        if self.kind is not None:
            out["kind"] = self.kind
        return out


def parse_record(name: str) -> TaskRecord | None:
    """The record a name in records/ holds (None for a name of another form)."""
    parts = name.split(".")
    try:
        task, state, attempts, start, ms, cpu = int(parts[0]), parts[1], int(parts[2]), int(parts[3]), \
            int(parts[4]), int(parts[5])
        if state == DONE and len(parts) == 6 + len(_STAT_FIELDS) + 1:
            stats = Stats(**{f: int(v) for f, v in zip(_STAT_FIELDS, parts[6:-1])})
            stats.seconds = ms / 1000
            return TaskRecord(task, state, attempts, start / 1000, ms / 1000, cpu / 1000, parts[-1], stats=stats)
        if state == FAILED and len(parts) == 8:
            return TaskRecord(task, state, attempts, start / 1000, ms / 1000, cpu / 1000, parts[-1], kind=parts[6])
    except (ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Running:
    """A task that started on `worker` at `start` (epoch seconds) and has not ended (or whose worker died);
    `beat`: its last beat, where read (rundir.beats; None: not read, or an older shardflow's empty entry)."""

    task: int
    start: float
    worker: str
    beat: Beat | None = None


def running_name(task_id: int, start: float, worker: str) -> str:
    return f"{task_name(task_id)}.{round(start * 1000)}.{_clean(worker, 120)}"


def parse_running(name: str) -> Running | None:
    parts = name.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return Running(int(parts[0]), int(parts[1]) / 1000, parts[2])


def with_beats(run_dir: Any, running: list[Running], limit: int = BEATS_READ) -> list[Running]:
    """`running` with the last beat of the first `limit` entries read (one GET each on object stores,
    concurrently; an entry removed meanwhile or written by an older shardflow keeps beat None)."""
    names = [f"{RUNNING}/{running_name(r.task, r.start, r.worker)}" for r in running[:limit]]
    beats = run_dir.read_many(names, parse=False)
    return [replace(r, beat=parse_beat(b)) for r, b in zip(running, beats)] + running[limit:]


def latest(records: Iterable[TaskRecord]) -> Iterator[TaskRecord]:
    """The last record of each task (names sort by task, then state; the latest start wins)."""
    best: TaskRecord | None = None
    runs = 0
    for record in records:
        if best is not None and record.task != best.task:
            best.runs = runs
            yield best
            best, runs = None, 0
        runs += 1
        if best is None or record.start >= best.start:
            best = record
    if best is not None:
        best.runs = runs
        yield best


# -- writing (run_task) --------------------------------------------------------------------------
def _touch(run_dir: Any, name: str, data: bytes = b"") -> None:
    """A file whose name is its content, created in one step (no temp, no fsync); `data`: a running
    entry's first beat (a reader that sees it empty for an instant shows no beat)."""
    if is_local(run_dir.url):
        path = f"{run_dir.path}/{name}"
        with in_new_folders(lambda file, _label: open(file, "wb"), path, path) as f:
            if data:
                f.write(data)
    else:
        run_dir.write_bytes(name, data)


def mark_running(run_dir: Any, task_id: int, start: float, worker: str, every: float = 0.0) -> str:
    """Say that task `task_id` runs on `worker` since `start` (beating every `every` s: its first beat
    says so); returns the name to pass to `mark_ended`."""
    name = f"{RUNNING}/{running_name(task_id, start, worker)}"
    _touch(run_dir, name, Beat(start, every).to_bytes())
    return name


def mark_ended(run_dir: Any, running: str) -> None:
    run_dir.remove(running)  # a local one is one unlink (RunDir.remove)


def write_record(run_dir: Any, record: TaskRecord) -> None:
    _touch(run_dir, f"{RECORDS}/{record.name()}")


class TaskClock:
    """Times one task's run on this worker (wall from the epoch, CPU of this process) and writes its
    running entry, its record and, when it ends, removes the running entry. CPU is the process's:
    exact on the processes backend and in pods (one task at a time per process); where threads run
    several tasks in one process (Dask threads) it counts their neighbours too."""

    def __init__(self, run_dir: Any, task_id: int) -> None:
        import time

        self._time = time
        self.run_dir, self.task_id, self.attempts = run_dir, task_id, 1
        self.worker = _this_worker()
        self.start, self._perf, self._cpu = time.time(), time.perf_counter(), time.process_time()
        self.every = heartbeat_seconds()
        self.due = self.start + self.every  # a task shorter than the interval writes no beat
        self._lock = threading.Lock()  # a beat and the entry's removal never cross
        self._stats: Stats | None = None
        self._writer: Any = None
        self._reader: Any = None
        self._reading_at = 0  # shards_in when the input being read started
        self._moved, self._counts = self.start, (0, 0, 0)  # when the counts last changed, and they
        try:  # the running entry is a view for status: a store that refuses it does not fail the task
            self._running: str | None = mark_running(run_dir, task_id, self.start, self.worker, self.every)
        except (OSError, ShardIOError):
            self._running = None
        if self._running is not None and self.every > 0:
            start_beats(self)

    # -- beats (rundir.beats): the counters the task keeps anyway, read by the beat thread ------------
    def follow(self, stats: Stats, writer: Any = None) -> None:
        """This attempt's counters (a retried attempt starts from new ones) and its ShardWriter."""
        self._stats, self._writer, self._reader = stats, writer, None

    def reading(self, reader: Any) -> None:
        """The input being read now (a CountingReader): its bytes count before the input ends."""
        self._reader, self._reading_at = reader, self._stats.shards_in if self._stats is not None else 0

    def progress(self) -> Beat:
        """The task's progress now (read from another thread: each number is one the task wrote)."""
        stats, writer, reader = self._stats or Stats(), self._writer, self._reader
        bytes_in = stats.bytes_in
        if reader is not None and stats.shards_in == self._reading_at:
            bytes_in += reader.nbytes
        parts = list(writer.shards) if writer is not None else []
        now = self._time.time()
        counts = (stats.samples_in, bytes_in, len(parts))
        if counts != self._counts:
            self._moved, self._counts = now, counts
        return Beat(now, self.every, self.attempts, self._moved, stats.samples_in, stats.samples_out,
                    stats.dropped, stats.skipped, stats.failed, bytes_in, sum(p.nbytes for p in parts),
                    stats.shards_in, len(parts))

    def beat(self) -> None:
        """Replace the running entry's content with the progress now (one atomic write)."""
        with self._lock:
            if self._running is not None:
                self.run_dir.write_bytes(self._running, self.progress().to_bytes())

    def record(self, state: str, *, stats: Stats | None = None, kind: str | None = None) -> TaskRecord:
        t = self._time
        return TaskRecord(self.task_id, state, self.attempts, self.start, t.perf_counter() - self._perf,
                          t.process_time() - self._cpu, self.worker, stats=stats, kind=kind)

    def write_done(self, stats: Stats) -> dict[str, Any]:
        """Write the done record (before the marker); returns it as JSON for the marker."""
        record = self.record(DONE, stats=stats)
        write_record(self.run_dir, record)
        return record.to_json()

    def write_failed(self, kind: str | None) -> None:
        write_record(self.run_dir, self.record(FAILED, kind=str(kind)))

    def ended(self) -> None:
        stop_beats(self)
        with self._lock:  # a beat being written finishes first; none comes after
            running, self._running = self._running, None
        if running is not None:
            try:
                mark_ended(self.run_dir, running)
            except (OSError, ShardIOError):  # left behind: status shows it with its age until the task is done
                pass
