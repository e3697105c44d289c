"""The processes backend's calls in flight, and what happens when a worker process dies.

A concurrent.futures pool whose worker dies (a native crash, an out-of-memory kill, os._exit in fn) is
broken for good: it fails every call in flight with BrokenProcessPool, stops its other workers and
takes no more work. A run must not end there (README: a task fails, the other tasks finish), so:

- the broken pool's calls that returned are reported as usual; in the lost ones, a task whose done
  marker exists finished before the death (a group's earlier tasks) and is reported done;
- the task that was on the dead worker is found from the run directory's running/ entries (rundir.records:
  `running/<task>.<start>.<host>~p<pid>`, written by every task as it starts and left behind by a
  killed process) and the workers' exit codes: the worker that died by itself, not by the pool's
  SIGTERM. It goes alone in its call from now on and is retried; a task whose worker died under it more
  than the job's `io_retries` times (JobSpec: a worker's death is transient trouble, kind io, like a
  storage error) fails, recorded in failed/, naming its input shards and how the worker died;
- the other unfinished tasks of the lost calls are innocent: back in the queue, uncounted. Rerunning an
  unfinished task is safe: outputs are atomic (temp + rename), stale temps are removed by name when the
  task starts again, and its done marker is written last (task.run_task). The run directory's temps the
  stopped workers left (a marker half-written) are swept while no worker runs, as prepare() does;
- when the dead worker cannot be told (it was idle, or every worker was stopped by a signal), every
  task of the lost calls that had started counts a death, each then going alone: a crash loop still ends;
- a fresh pool (and a fresh counts queue: a dead writer may hold the old one's lock) runs the rest. A pool
  whose workers die before any task started in it stops the run instead: they would die again (a script
  that runs the job at import, a module that crashes on import); the message says so, with the main-guard
  hint (backends.main_guard) when nothing ran in this run at all.

The normal path costs nothing more: no message per task, no bookkeeping beyond the futures.
"""

from __future__ import annotations

import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from shardflow.backends.groups import GroupSizer
from shardflow.backends.main_guard import startup_hint
from shardflow.errors import FailureKind
from shardflow.job.dead_workers import WORKER_DIED, record_worker_deaths, worker_died_error
from shardflow.rundir.beats import parse_beat
from shardflow.rundir.layout import RUNNING, failed_file
from shardflow.rundir.records import parse_running, pid_of
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

TakeGroup = Callable[[list[Task], int, "set[int] | frozenset[int]"], list[Task]]


@dataclass
class Pool:
    """One pool of workers and the queue its workers send sample counts on."""

    executor: ProcessPoolExecutor
    counts: Any  # multiprocessing.Queue[int]
    started: float  # time.time() when it was made: older running/ entries are not its workers'


@dataclass
class _Death:
    """A task that had started on a worker of a broken pool: that worker, how it ended, its running/ entry."""

    pid: int
    exitcode: int | None
    entry: str


class PoolCalls:
    """The calls in flight on the pool: groups of tasks taken in plan order (backends.groups: one task
    per call until tasks are measured, then tiny ones together), at most 2 per worker; a pool broken by
    a dying worker is replaced (module docstring)."""

    def __init__(self, start_pool: Callable[[], Pool], run_group: Callable[[list[Task]], Any],
                 take_group: TakeGroup, drain: Callable[[Any], None], job: "ShardJob", tasks: list[Task],
                 workers: int) -> None:
        self.start_pool, self.run_group, self.take_group, self.drain = start_pool, run_group, take_group, drain
        self.job, self.workers = job, workers
        self.pool = start_pool()
        self.order = {task.id: index for index, task in enumerate(tasks)}
        self.remaining = list(reversed(tasks))  # popped from the end: plan order
        self.running: dict[Future, list[Task]] = {}
        self.sizer = GroupSizer()
        self.finished_any = False  # a call returned in this run
        self.pool_ran = False  # a task started in the current pool
        self.stopped = False  # workers die before any task: nothing more is submitted
        self.alone: set[int] = set()  # tasks whose worker died under them: one per call from now on
        self.deaths: dict[int, int] = {}  # task id -> workers that died running it
        self.unexplained = 0  # deaths of a worker that ran none of the lost tasks

    def top_up(self) -> None:
        while self.remaining and not self.stopped and len(self.running) < 2 * self.workers:
            group = self.take_group(self.remaining, self.sizer.size(len(self.remaining), self.workers), self.alone)
            try:
                self.running[self.pool.executor.submit(self.run_group, group)] = group
            except (BrokenProcessPool, OSError) as exc:  # a worker just died
                if isinstance(exc, OSError) and not getattr(self.pool.executor, "_broken", False):
                    raise  # a real failure to start a worker (fork, file descriptors): not a death
                # (the pool's manager marks it broken and closes its call queue while submit, which checked
                # before, starts a worker that is handed that queue: OSError "handle is closed", not Broken)
                self.remaining.extend(reversed(group))
                if self.running:  # the calls in flight say so when collected, and a new pool follows
                    return
                self._replace_pool()  # it died with no call in flight: nothing is lost

    def collect(self, future: Future) -> list[TaskResult]:
        """The results of a finished call; when its pool broke, those of every call of that pool."""
        group = self.running.pop(future, None)
        if group is None:  # collected already, with the other calls of a pool that broke
            return []
        try:
            value = future.result()
        except BrokenProcessPool:
            return self._pool_broke(group)
        return self._results(group, value)

    def _results(self, group: list[Task], value: list[tuple[TaskResult, float]]) -> list[TaskResult]:
        self.finished_any = self.pool_ran = True
        results = []
        for result, seconds in value:
            if result.status == "done":
                self.sizer.measured(seconds)
            results.append(result)
        # tasks after one that ends the run were not started: back in the queue, they run only if the
        # consumer goes on (run_job stops at that result, so they stay pending for a rerun)
        self.remaining.extend(reversed(group[len(value):]))
        return results

    def _pool_broke(self, group: list[Task]) -> list[TaskResult]:
        """A worker died: report what the pool finished, find the task it killed, requeue the others and
        start a new pool (module docstring)."""
        pool = self.pool
        processes = dict(getattr(pool.executor, "_processes", None) or {})  # pid -> Process
        pool.executor.shutdown(wait=True)  # its manager stopped every other worker: all have exited now
        results: list[TaskResult] = []
        lost = list(group)
        for future, call in list(self.running.items()):
            del self.running[future]
            if isinstance(future.exception(), BrokenProcessPool):
                lost.extend(call)
            else:
                results.extend(self._results(call, future.result()))
        self._sweep()
        done = [task for task in lost if self._is_done(task)]
        results.extend(TaskResult.from_marker(t.id, self.job.rundir().read_done(t.id)) for t in done)
        unfinished = [task for task in lost if task not in done]
        entries = self._started(lost, processes, pool.started)  # a done task's too: killed before it removed it
        started = {task.id: entries[task.id] for task in unfinished if task.id in entries}
        self.pool_ran = self.pool_ran or bool(entries) or bool(done)
        if not self.pool_ran:
            return results + self._stop(unfinished)
        again = []
        suspects = self._suspects(started, processes)
        for task in unfinished:
            death = suspects.get(task.id)
            if death is None:
                again.append(task)
                continue
            count = self.deaths[task.id] = self.deaths.get(task.id, 0) + 1
            if count > self.job.spec.io_retries:
                results.append(self._failed(task, count, death))
            else:
                self.alone.add(task.id)
                again.append(task)
        for death in entries.values():
            self._remove(death.entry)  # its worker is gone: status must not show it running
        self.remaining.extend(sorted(again, key=lambda t: self.order.get(t.id, 0), reverse=True))
        self._replace_pool()
        return results

    def _suspects(self, started: dict[int, _Death], processes: dict[int, Any]) -> dict[int, _Death]:
        """The tasks that may have killed their worker: those on a worker that died by itself (not by the
        pool's SIGTERM). A worker that died running none of them (idle, between tasks) costs nobody a
        try, up to io_retries times in a run; when that is exceeded, or no worker can be told apart (all
        ended by a signal), every task that had started."""
        dead = {pid for pid, process in processes.items() if process.exitcode not in (None, -signal.SIGTERM)}
        culprits = {tid: d for tid, d in started.items() if d.pid in dead}
        if culprits or not started:
            return culprits
        if dead and self.unexplained < self.job.spec.io_retries:
            self.unexplained += 1
            return {}
        return started

    def _sweep(self) -> None:
        """Remove the run directory's temps that the stopped workers left (a done marker being written
        when the pool's SIGTERM came): no worker runs now, so none is in use (RunDir.remove_stale_temps,
        which prepare() calls for the same reason)."""
        try:
            self.job.rundir().remove_stale_temps()
        except Exception:  # noqa: BLE001 - the next run's prepare() removes them
            pass

    def _is_done(self, task: Task) -> bool:
        try:
            return self.job.rundir().is_done(task.id)
        except Exception:  # noqa: BLE001 - cannot tell: run again (a done task is skipped by its marker)
            return False

    def _started(self, tasks: list[Task], processes: dict[int, Any], since: float) -> dict[int, _Death]:
        """The tasks of `tasks` that had started on a worker of the broken pool and not ended (the running/
        entries the killed workers left behind), with that worker's exit code."""
        ids = {task.id for task in tasks}
        found: dict[int, _Death] = {}
        try:
            for name in self.job.rundir().list_names(RUNNING):
                entry = parse_running(name)
                pid = pid_of(entry.worker) if entry is not None else None
                if entry is None or pid is None or entry.task not in ids or pid not in processes \
                        or entry.start < since - 1.0:
                    continue
                found[entry.task] = _Death(pid, processes[pid].exitcode, f"{RUNNING}/{name}")
        except Exception:  # noqa: BLE001 - unreadable: who died cannot be told
            return found
        return found

    def _failed(self, task: Task, count: int, death: _Death) -> TaskResult:
        """The task whose workers died `count` times under it: failed (kind io: a rerun retries it), recorded,
        its temps removed (job.dead_workers)."""
        samples = self._samples_read(death.entry)
        error = worker_died_error(task, count, self.job.spec.io_retries, _how(death.exitcode), samples)
        return record_worker_deaths(self.job, task, error, count)

    def _samples_read(self, entry: str) -> int:
        """Samples the task had read at its last beat (rundir.beats; 0 when no beat came)."""
        try:
            beat = parse_beat(self.job.rundir().read_many([entry], parse=False)[0])
        except Exception:  # noqa: BLE001 - a view only
            return 0
        return beat.samples_in if beat is not None else 0

    def _remove(self, entry: str) -> None:
        try:
            self.job.rundir().remove(entry)
        except Exception:  # noqa: BLE001 - left behind: status shows its age
            pass

    def _stop(self, tasks: list[Task]) -> list[TaskResult]:
        """Workers died before starting any task in this pool: a new one would too. Nothing more is
        submitted; the lost tasks fail (kind io, not recorded: nothing of theirs ran)."""
        self.stopped = True
        error = "worker process died before starting any task"
        if not self.finished_any:
            error += startup_hint()
        return [TaskResult.failed(task.id, error, FailureKind.IO) for task in tasks]

    def _replace_pool(self) -> None:
        """A new pool for the rest; the old one's counts queue drained and closed (a worker that died
        while sending may hold its lock)."""
        old = self.pool
        old.executor.shutdown(wait=True)
        self.drain(old.counts)
        old.counts.close()
        self.pool = self.start_pool()
        self.pool_ran = False


def killed_its_worker(job: "ShardJob", task: Task) -> bool:
    """Whether `task` failed last time because its worker process died under it: run alone, it still goes
    to a pool (backends.local._in_driver), so that the crash takes a worker and is reported, not the driver."""
    try:
        record = job.rundir().read_json(failed_file(task.id))
    except Exception:  # noqa: BLE001 - no failure recorded (the rule), or unreadable
        return False
    return isinstance(record, dict) and str(record.get("error", "")).startswith(WORKER_DIED)


def _how(exitcode: int | None) -> str:
    if exitcode is None or exitcode == -signal.SIGTERM:
        return "stopped" if exitcode is not None else "exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}" + (", e.g. out of memory" if exitcode == -signal.SIGKILL else "")
    return f"exit code {exitcode}"
