"""The submission and collection loop of the Dask backend: tasks go out in bounded batches of calls
(one task each, or groups of tiny ones: backends.groups), results come back as Dask events, one
TaskResult per task whatever the grouping, and failures of the cluster become failed results.
"""

from __future__ import annotations

import hashlib
import queue
import re
import time
import uuid
from concurrent.futures import CancelledError as _FuturesCancelledError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from shardflow.backends.dask.on_worker import run_on_worker
from shardflow.backends.groups import GroupSizer, take_group
from shardflow.backends.wire import dumps_job, missing_module_message
from shardflow.errors import FailureKind, JobError
from shardflow.job.dead_workers import inputs_text, remove_dead_temps
from shardflow.job.progress import Progress
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

_DONE, _EVENT = "done", "event"
_STATUS_POLL_S = 1.0  # how often the client checks the scheduler connection while nothing happens
_LIMIT_REFRESH_S = 5.0  # how often the in-flight bound follows the cluster's size (adaptive clusters)


def import_distributed() -> Any:
    try:
        import distributed
    except ModuleNotFoundError as exc:
        raise JobError("the dask backend needs dask and distributed: pip install 'shardflow[dask]'") from exc
    return distributed


def cluster_threads(client: Any) -> int:
    try:
        return sum(client.nthreads().values())
    except Exception:  # noqa: BLE001
        return 0


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)[:40] or "job"


@dataclass
class _Call:
    """One Dask task in flight: its future and its tasks whose results the client has not yet had."""

    future: Any
    pending: dict[int, Task]


class DaskRun:
    """One run on a Dask cluster: the job published once, calls submitted in bounded batches in plan
    order, results and live sample counts received as Dask events."""

    def __init__(self, job: "ShardJob", tasks: list[Task], progress: Progress, client: Any, scheduler: str,
                 max_in_flight: int | None, sizer: GroupSizer | None = None) -> None:
        self.job, self.tasks, self.progress, self.client, self.scheduler = job, tasks, progress, client, scheduler
        self.max_in_flight = max_in_flight
        self.sizer = sizer or GroupSizer()
        self.distributed = import_distributed()
        run_id = uuid.uuid4().hex[:8]
        self.prefix = f"shardflow-{_safe_name(job.name)}-{run_id}"
        self.topic = f"shardflow-{_safe_name(job.name)}-events-{run_id}"  # sample counts and results
        self.events: "queue.SimpleQueue[tuple[str, Any]]" = queue.SimpleQueue()
        self.running: dict[Any, _Call] = {}
        self.remaining = list(reversed(tasks))  # popped from the end: plan order
        self.alone: set[int] = set()  # tasks that go one per call from now on (their group's workers died)
        self.submitted = 0
        self.gathered = 0  # results read from return values, not from events (their counts may trail)
        self.job_variable: Any = None
        self.subscribed = False
        self.token = ""
        self.job_name = f"shardflow-{_safe_name(job.name)}-job-{run_id}"
        self.resources: dict[str, float] | None = None  # {"GPU": n} for GPU jobs (resources.py)

    def publish_job(self) -> None:
        """The job goes to the scheduler once; each worker fetches it once, on its first task (workers
        that join later or replace dead ones too)."""
        blob = dumps_job(self.job)
        self.token = hashlib.sha256(blob).hexdigest()[:16]
        self.job_variable = self.distributed.Variable(self.job_name, client=self.client)
        self.job_variable.set(blob)
        try:
            self.client.subscribe_topic(self.topic, lambda event: self.events.put((_EVENT, event[1])))
            self.subscribed = True
        except Exception:  # noqa: BLE001 - no live counts then; results still carry them
            pass

    def futures(self) -> list[Any]:
        return [call.future for call in self.running.values()]

    def _size(self) -> tuple[int, int]:
        """(calls to keep in flight, free slots worth a submission) for the cluster's current size."""
        threads = max(1, cluster_threads(self.client))
        limit = self.max_in_flight or max(4, 3 * threads)
        return limit, (min(threads, self.max_in_flight) if self.max_in_flight else threads)

    def _take(self, size: int) -> list[Task]:
        return take_group(self.remaining, size, self.alone)

    def _top_up(self, limit: int, threads: int) -> None:
        """Submit calls until `limit` are in flight, in one call (one graph update for the scheduler),
        once at least `threads` slots are free or no task is left to wait for. Calls carry no
        dependency, so Dask queues them and hands them out in plan order as worker threads free up."""
        free = limit - len(self.running)
        if not self.remaining or free <= 0 or (free < threads and len(self.running) >= threads):
            return
        size = self.sizer.size(len(self.remaining), threads)
        groups = [self._take(size) for _ in range(free) if self.remaining]
        keys = [f"{self.prefix}-{g[0].id:06d}" + (f"-{g[-1].id:06d}" if len(g) > 1 else "") for g in groups]
        futures = self.client.map(
            run_on_worker, groups, token=self.token, variable=self.job_variable.name, topic=self.topic, key=keys,
            priority=-self.submitted, pure=False, retries=0, resources=self.resources)
        self.submitted += len(groups)
        for future, group in zip(futures, groups):
            self.running[future.key] = _Call(future, {task.id: task for task in group})
            future.add_done_callback(lambda f: self.events.put((_DONE, f.key)))

    def results(self) -> Iterator[TaskResult]:
        """Results in the order tasks finish; sample counts go to the progress bar meanwhile."""
        (limit, threads), sized_at = self._size(), time.monotonic()
        self._top_up(limit, threads)
        finished = 0
        while self.running:
            if time.monotonic() - sized_at > _LIMIT_REFRESH_S:
                (limit, threads), sized_at = self._size(), time.monotonic()  # the cluster may have grown or shrunk
                self._top_up(limit, threads)
            try:
                kind, value = self.events.get(timeout=_STATUS_POLL_S)
            except queue.Empty:
                if self.client.status not in ("running", "connecting"):
                    raise _lost(self.scheduler, finished, self._tasks_running(), self.job) from None
                continue
            ready = self._on_event(value) if kind == _EVENT else self._on_done(value, finished)
            for result in ready:
                if not self.subscribed and result.status == "done":
                    self.progress.add_samples(result.stats.samples_in)
                finished += 1
                yield result
            # after the consumer took them (the queued calls keep the workers busy meanwhile): a consumer
            # that stops at a result (run_job at one that ends the run) submits nothing more
            self._top_up(limit, threads)
        if self.subscribed and self.gathered:  # an event may still carry the last sample counts of those calls
            _drain_samples(self.events, self.progress)

    def _tasks_running(self) -> int:
        return sum(len(call.pending) for call in self.running.values())

    def _report(self, call: _Call, result: TaskResult, seconds: float | None = None) -> list[TaskResult]:
        """[result] the first time a result of this call's task arrives, [] for a repeat (a call rerun
        after a worker died reports the tasks it had finished again)."""
        if call.pending.pop(result.task_id, None) is None:
            return []
        if result.status == "done":
            self.sizer.measured(result.stats.seconds if seconds is None else seconds)
        return [result]

    def _on_event(self, value: Any) -> list[TaskResult]:
        """Sample counts for the bar, and the results of tasks just finished, ahead of their call's end."""
        if not isinstance(value, dict):
            return []
        self.progress.add_samples(int(value.get("samples") or 0))
        call = self.running.get(value.get("key"))
        if call is None:
            return []
        return [r for payload, seconds in value.get("results") or ()
                for r in self._report(call, TaskResult.from_json(payload), seconds)]

    def _on_done(self, key: Any, finished: int) -> Iterable[TaskResult]:
        """The results of a finished call's tasks that no event brought."""
        call = self.running.pop(key, None)
        if call is None:
            return []
        try:
            return self._gather(call, finished) if call.pending else []
        finally:
            call.future.release()

    def _gather(self, call: _Call, finished: int) -> Iterable[TaskResult]:
        """Results of a call from its return value, or failed ones saying why the cluster could not run it."""
        distributed = self.distributed
        try:
            value = call.future.result()
        except distributed.KilledWorker as exc:
            if len(call.pending) > 1:  # one of them may kill its workers: each goes alone now, retried alone
                self.alone.update(call.pending)
                self.remaining.extend(reversed(list(call.pending.values())))
                return []
            for task in call.pending.values():
                remove_dead_temps(self.job, task)
            return self._failed(call, FailureKind.IO, (
                f"the workers holding this task died {exc.allowed_failures + 1} times (killed, out of memory or "
                f"lost; distributed.scheduler.allowed-failures={exc.allowed_failures}), last "
                f"{getattr(exc.last_worker, 'address', exc.last_worker)}; input "
                f"{', '.join(inputs_text(t) for t in call.pending.values())}; a rerun retries it"))
        except (_FuturesCancelledError, distributed.client.FutureCancelledError) as exc:
            if self.client.status != "running" or getattr(exc, "reason", "") == "scheduler-connection-lost":
                raise _lost(self.scheduler, finished, self._tasks_running() + len(call.pending), self.job) from None
            return self._failed(call, FailureKind.IO, f"cancelled on the Dask cluster ({getattr(exc, 'reason', exc)})")
        except ModuleNotFoundError as exc:  # the worker could not even load shardflow's task function
            return self._failed(call, FailureKind.USER, missing_module_message("(some worker)", exc.name))
        except Exception as exc:  # noqa: BLE001 - a bug or an unpicklable result: fail these tasks visibly
            if self.client.status not in ("running",):
                raise _lost(self.scheduler, finished, self._tasks_running() + len(call.pending), self.job) from None
            return self._failed(call, FailureKind.INPUT, f"Dask task error: {type(exc).__name__}: {exc}")
        if not isinstance(value, list) or not all(isinstance(r, TaskResult) for r in value):
            return self._failed(call, FailureKind.INPUT,
                                f"Dask task returned {type(value).__name__}, not a list of TaskResults")
        results = [r for result in value for r in self._report(call, result)]
        self.gathered += len(results)
        # tasks after one that ends the run were not started: back in the queue, they run only if the
        # consumer goes on (run_job stops at that result, so they stay pending for a rerun)
        self.remaining.extend(reversed(list(call.pending.values())))
        return results

    def _failed(self, call: _Call, kind: str, error: str) -> Iterator[TaskResult]:
        """Each unreported task of `call` failed with `error`, recorded (the workers could not record it)
        as the consumer takes it: a consumer that stops at the first leaves the others pending."""
        tasks, call.pending = list(call.pending.values()), {}
        return (_record(self.job, task, TaskResult.failed(task.id, error, kind)) for task in tasks)


def _record(job: "ShardJob", task: Task, result: TaskResult) -> TaskResult:
    """Write a failure the workers could not write themselves (the worker died, the job did not load)."""
    try:
        job.rundir().record_failure(task, result.error or "", result.kind or FailureKind.IO)
    except Exception:  # noqa: BLE001 - the report still carries the failure
        pass
    return result


def _drain_samples(events: "queue.SimpleQueue[tuple[str, Any]]", progress: Progress, wait: float = 0.2) -> None:
    """Count the sample events still on their way (the last ones of each call trail its end)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            kind, value = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return
        if kind == _EVENT and isinstance(value, dict):
            progress.add_samples(int(value.get("samples") or 0))


def _lost(scheduler: str, finished: int, running: int, job: "ShardJob") -> JobError:
    return JobError(
        f"lost the Dask scheduler at {scheduler} ({finished} tasks finished in this run, {running} were running); "
        f"finished tasks are recorded in the run directory {job.run_dir}: rerun to resume"
    )
