"""Tasks that killed the pod (or Slurm array task) running them: counted, run last, failed when they keep at it.

`shardflow worker` runs a chunk's tasks one after another in one process. A sample that ends that
process natively (a segfault in a decoder, the memory limit's SIGKILL, os._exit in fn) ends the whole
chunk; the orchestrator restarts the index and the new process reaches the same task and dies again,
while the chunk's tasks after it never run and nothing in failed/ says which shard did it. The only
trace is the task's running/ entry (rundir.records), which a killed process leaves behind. So, when a
worker starts its chunk, it reads the entries left for the chunk's tasks:

- A leftover entry is a DEAD ATTEMPT when (1) it was written on this host by a process that is gone
  (the pid, checked here: a Slurm array task rerun on the same node, local runs), or (2) its beats
  stopped: no beat (rundir.beats) for STALE_BEATS intervals by this machine's clock, or its content
  did not change while this worker watched it for 1.5 intervals + 1 s (by this worker's own clock: no
  clock skew between pods). A running task's beat is rewritten every interval, so an entry that
  changes meanwhile belongs to a LIVE attempt (a duplicate pod running the same task now): it is left
  alone and not counted. With beats off (SHARDFLOW_HEARTBEAT=0) nothing changes, so every leftover
  entry of another host counts after the wait: duplicates cannot be told then.
- Watching costs nothing up front: the chunk's other tasks run first (suspects go last), and only a
  task with an undecided entry waits for what is left of its window when its turn comes.
- A dead attempt becomes a task record (records/, state failed, kind `died`, its start and worker: the
  report and `status` show it as a failed try) and its running/ entry is removed, so `status` no longer
  shows it running. The record's name is made from the entry alone, so two pods burying the same entry
  write the same name: each dead attempt counts once. The records outlive the pods: they ARE the count.
- A task whose dead attempts exceed the job's `io_retries` (a worker's death is transient trouble, kind
  io, as on the processes backend) is not run again: it is recorded in failed/ (kind io, the message of
  job.dead_workers naming its input shards), its temps removed, and the worker's exit status follows
  the contract for an io failure (75). Later pods of the run keep it failed without running it; raising
  io_retries, or `--redo`, runs it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from shardflow.job.dead_workers import record_worker_deaths, worker_died_error
from shardflow.rundir.beats import STALE_BEATS, heartbeat_seconds, parse_beat
from shardflow.rundir.layout import RECORDS, RUNNING, task_name
from shardflow.rundir.pids import pid_alive
from shardflow.rundir.records import (
    FAILED,
    Running,
    TaskRecord,
    host_of,
    parse_record,
    parse_running,
    pid_of,
    running_name,
    worker_name,
    write_record,
)
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

DIED = "died"  # the kind of a dead attempt's record in records/ (not a FailureKind: no failure of the task yet)
HOW = "the pod or process ended during it; its exit status is not known here"
THEN = "Later pods skip it; raise io_retries or rerun with --redo to run it again"


@dataclass
class _Leftover:
    """A running/ entry of another process for one of the chunk's tasks, not yet judged."""

    entry: Running
    content: bytes | None
    seen: float  # time.monotonic() when this worker first read it


@dataclass
class DeadAttempts:
    """The dead attempts of one chunk's tasks (module docstring): found when the chunk starts, settled
    for each task right before it runs."""

    job: "ShardJob"
    task_ids: range
    sleep: Callable[[float], None] = time.sleep
    deaths: dict[int, set[tuple[float, str]]] = field(default_factory=dict)  # task -> (start, worker) of each
    undecided: dict[int, list[_Leftover]] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)  # task -> samples read by the last attempt buried here

    @property
    def run_dir(self) -> Any:
        return self.job.rundir()

    def scan(self) -> None:
        """Count the dead attempts recorded by earlier pods, and judge the leftover running/ entries."""
        prefix = _common_prefix(task_name(self.task_ids.start), task_name(self.task_ids.stop - 1))
        self._count(self.run_dir.list_names(RECORDS, prefix=prefix))
        entries = [e for e in map(parse_running, self.run_dir.list_names(RUNNING, prefix=prefix))
                   if e is not None and e.task in self.task_ids]
        if not entries:
            return
        done = {t for t in {e.task for e in entries} if self.run_dir.is_done(t)}  # a HEAD each: entries are few
        entries = [e for e in entries if e.task not in done]  # a done task is skipped: its entries are views
        names = [f"{RUNNING}/{running_name(e.task, e.start, e.worker)}" for e in entries]
        now = time.monotonic()
        for entry, content in zip(entries, self.run_dir.read_many(names, parse=False)):
            if content is None:  # ended meanwhile
                continue
            leftover = _Leftover(entry, content, now)
            if _dead_now(entry, content):
                self._bury(leftover)
            else:
                self.undecided.setdefault(entry.task, []).append(leftover)

    def order(self, tasks: Iterable[Task]) -> list[Task]:
        """`tasks` with the suspects (a dead or undecided attempt) last, fewest deaths first, else in plan order."""
        tasks = list(tasks)
        suspect = {t: len(self.deaths.get(t, ())) for t in self.task_ids if t in self.deaths or t in self.undecided}
        return [t for t in tasks if t.id not in suspect] + sorted(
            (t for t in tasks if t.id in suspect), key=lambda t: suspect[t.id])

    def verdict(self, task: Task) -> TaskResult | None:
        """Right before `task` runs: settle its undecided entries (waiting out their window), then the
        failed result (recorded) when its dead attempts exceed io_retries, else None: run it (run_task
        skips it when done)."""
        if task.id not in self.deaths and task.id not in self.undecided:
            return None
        if self.run_dir.is_done(task.id):  # another pod finished it meanwhile
            return None
        for leftover in self.undecided.pop(task.id, []):
            self.sleep(max(leftover.seen + _window(leftover.content) - time.monotonic(), 0.0))
            name = f"{RUNNING}/{running_name(task.id, leftover.entry.start, leftover.entry.worker)}"
            content = self.run_dir.read_many([name], parse=False)[0]
            if content is not None and content == leftover.content:  # no beat while watched: dead
                self._bury(leftover)
        self._count(self.run_dir.list_names(RECORDS, prefix=f"{task_name(task.id)}.{FAILED}."))  # other pods'
        count = len(self.deaths.get(task.id, ()))
        retries = self.job.spec.io_retries
        if count <= retries:
            return None
        error = worker_died_error(task, count, retries, HOW, self.samples.get(task.id, 0), THEN)
        return record_worker_deaths(self.job, task, error, count)

    def _count(self, record_names: Iterable[str]) -> None:
        for record in filter(None, map(parse_record, record_names)):
            if record.state == FAILED and record.kind == DIED and record.task in self.task_ids:
                self.deaths.setdefault(record.task, set()).add((round(record.start, 3), record.worker))

    def _bury(self, leftover: _Leftover) -> None:
        """A dead attempt: its record written (the count), then its running/ entry removed."""
        entry = leftover.entry
        beat = parse_beat(leftover.content)
        last = beat.at if beat is not None else entry.start
        attempts = beat.attempt if beat is not None else 1
        record = TaskRecord(entry.task, FAILED, attempts, entry.start, max(last - entry.start, 0.0), 0.0,
                            entry.worker, kind=DIED)
        write_record(self.run_dir, record)
        self.run_dir.remove(f"{RUNNING}/{running_name(entry.task, entry.start, entry.worker)}")
        self.deaths.setdefault(entry.task, set()).add((round(entry.start, 3), entry.worker))
        self.samples[entry.task] = beat.samples_in if beat is not None else 0


def _dead_now(entry: Running, content: bytes | None) -> bool:
    """Dead without watching: this host's process that is gone, or no beat for STALE_BEATS intervals."""
    if host_of(entry.worker) == host_of(worker_name()):
        pid = pid_of(entry.worker)
        if pid is not None:
            return not pid_alive(pid)
    beat = parse_beat(content)
    every = beat.every if beat is not None else heartbeat_seconds()
    last = beat.at if beat is not None else entry.start
    return every > 0 and time.time() - last > STALE_BEATS * every


def _window(content: bytes | None) -> float:
    """How long an entry must stay unchanged to be dead: 1.5 of its beat intervals, plus 1 s for a slow write."""
    beat = parse_beat(content)
    every = beat.every if beat is not None else heartbeat_seconds()
    return 1.5 * every + 1.0


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
