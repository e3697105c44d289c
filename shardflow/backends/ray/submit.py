"""The submission and collection loop of the Ray backend: Ray tasks (one shardflow task each, or groups
of tiny ones: backends.groups) kept in flight up to a bound, results read as they finish, live sample
counts from a ProgressSink actor, and Ray's failures turned into failed results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from shardflow.backends.groups import GroupSizer, take_group
from shardflow.backends.ray.on_worker import TransientFailure, run_on_ray
from shardflow.backends.ray.resources import slots
from shardflow.errors import FailureKind, JobError
from shardflow.job.dead_workers import inputs_text, remove_dead_temps
from shardflow.job.progress import Progress
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

_WAIT_S = 0.5  # how long one ray.wait blocks before the sample counts are fetched
_SIZE_REFRESH_S = 5.0  # how often the in-flight bound follows the cluster's size (autoscaling)
CANCEL_WAIT_S = 10.0  # how long cancelled tasks get to abort their temp outputs


class ProgressSink:
    """A Ray actor (no CPU) that adds up the sample counts workers send while tasks run, per task, so
    the driver's bar moves during long tasks; the driver takes them every _WAIT_S."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, task_id: int, samples: int) -> None:
        self.counts[task_id] = self.counts.get(task_id, 0) + samples

    def take(self) -> dict[int, int]:
        counts, self.counts = self.counts, {}
        return counts


@dataclass
class _Call:
    """One Ray task in flight and the shardflow tasks it runs."""

    ref: Any
    tasks: list[Task]


class RayRun:
    """One run on a Ray cluster: the job put once, calls submitted in plan order up to a bound."""

    def __init__(self, ray: Any, job: "ShardJob", tasks: list[Task], progress: Progress, options: dict[str, Any],
                 max_in_flight: int | None, sizer: GroupSizer) -> None:
        self.ray, self.job, self.progress, self.options = ray, job, progress, options
        self.max_in_flight, self.sizer = max_in_flight, sizer
        self.remaining = list(reversed(tasks))  # popped from the end: plan order
        self.alone: set[int] = set()  # tasks that go one per call from now on (their group's worker died)
        self.running: dict[Any, _Call] = {}
        self.counted: dict[int, int] = {}  # samples of unfinished tasks already on the bar
        self.finished: set[int] = set()
        self.box: list[Any] = []
        self.sink: Any = None
        self.remote: Any = None

    def publish(self, blob: bytes) -> None:
        """The job into the object store once; the remote function (worker processes kept for the run:
        max_calls=0, which Ray otherwise sets to 1 for GPU tasks); the progress actor."""
        self.box = [self.ray.put(blob)]  # in a list: tasks get the ref, and unpickle the job once per process
        self.remote = self.ray.remote(max_calls=0)(run_on_ray).options(**self.options)
        try:
            self.sink = self.ray.remote(num_cpus=0, max_restarts=0)(ProgressSink).remote()
        except Exception:  # noqa: BLE001 - no live counts then; results still carry them
            self.sink = None

    def refs(self) -> list[Any]:
        return [call.ref for call in self.running.values()]

    def _bound(self) -> tuple[int, int]:
        """(calls to keep in flight, tasks the cluster runs at once)."""
        try:
            at_once = slots(self.options, self.ray.cluster_resources())
        except Exception:  # noqa: BLE001
            at_once = 1
        return (self.max_in_flight or max(4, 3 * at_once)), at_once

    def _take(self, size: int) -> list[Task]:
        return take_group(self.remaining, size, self.alone)

    def _top_up(self, limit: int, at_once: int) -> None:
        while self.remaining and len(self.running) < limit:
            group = self._take(self.sizer.size(len(self.remaining), at_once))
            ref = self.remote.remote(group, self.box, self.sink)
            self.running[ref] = _Call(ref, group)

    def results(self, address: str) -> Iterator[TaskResult]:
        """Results in the order tasks finish; live sample counts go to the progress bar meanwhile."""
        (limit, at_once), sized_at = self._bound(), time.monotonic()
        self._top_up(limit, at_once)
        while self.running:
            if time.monotonic() - sized_at > _SIZE_REFRESH_S:
                (limit, at_once), sized_at = self._bound(), time.monotonic()
            try:
                ready, _ = self.ray.wait(self.refs(), num_returns=1, timeout=_WAIT_S)
            except self.ray.exceptions.RaySystemError as exc:  # the driver lost its cluster
                raise lost_cluster(address, len(self.finished), self.job, exc) from None
            self._take_counts()
            for ref in ready:
                yield from self._collect(self.running.pop(ref))
            # after the consumer took them: a consumer that stops at a result submits nothing more
            self._top_up(limit, at_once)

    def _take_counts(self) -> None:
        if self.sink is None:
            return
        try:
            counts = self.ray.get(self.sink.take.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a lost progress actor costs the live counts only
            self.sink = None
            return
        for task_id, samples in counts.items():
            if task_id not in self.finished:
                self.counted[task_id] = self.counted.get(task_id, 0) + samples
                self.progress.add_samples(samples)

    def _report(self, payload: dict[str, Any], seconds: float) -> list[TaskResult]:
        result = TaskResult.from_json(payload)
        if result.task_id in self.finished:
            return []
        self.finished.add(result.task_id)
        counted = self.counted.pop(result.task_id, 0)
        if result.status == "done":
            self.sizer.measured(seconds)
            self.progress.add_samples(result.stats.samples_in - counted)  # a rerun's counts came twice: corrected
        return [result]

    def _collect(self, call: _Call) -> Iterator[TaskResult]:
        """The results of a finished call, or failed ones saying why Ray could not run it."""
        ray = self.ray
        try:
            value = ray.get(call.ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, TransientFailure):  # Ray's retries are spent: report what the last try gave
                value = cause.results
            else:
                yield from self._failed(call.tasks, FailureKind.INPUT, f"Ray task error: {_last_line(exc)}")
                return
        except ray.exceptions.TaskCancelledError:
            yield from self._failed(call.tasks, FailureKind.IO, "cancelled on the Ray cluster")
            return
        except (ray.exceptions.RaySystemError, ray.exceptions.RayError) as exc:  # the worker or node died
            if len(call.tasks) > 1:  # one of them may kill its workers: each goes alone now
                unfinished = [t for t in call.tasks if t.id not in self.finished]
                self.alone.update(t.id for t in unfinished)
                self.remaining.extend(reversed(unfinished))
                return
            for task in call.tasks:
                remove_dead_temps(self.job, task)
            yield from self._failed(call.tasks, FailureKind.IO, (
                f"the Ray workers running this task died {self.options.get('max_retries', 0) + 1} times (killed, out "
                f"of memory, or their node lost): {type(exc).__name__}: {_last_line(exc)}; input "
                f"{', '.join(inputs_text(t) for t in call.tasks)}; a rerun retries it"))
            return
        for payload, seconds in value:
            yield from self._report(payload, seconds)
        # tasks after one that ends the run were not started: back in the queue, they run only if the
        # consumer goes on (run_job stops at that result, so they stay pending for a rerun)
        seen = {payload["task_id"] for payload, _ in value}
        self.remaining.extend(reversed([t for t in call.tasks if t.id not in seen]))

    def _failed(self, tasks: list[Task], kind: str, error: str) -> Iterator[TaskResult]:
        """Each unreported task failed with `error`, recorded here (the worker could not record it)."""
        for task in tasks:
            if task.id in self.finished:
                continue
            self.finished.add(task.id)
            result = TaskResult.failed(task.id, error, kind)
            try:
                self.job.rundir().record_failure(task, error, kind)
            except Exception:  # noqa: BLE001 - the report still carries the failure
                pass
            yield result

    def cancel(self) -> None:
        """Cancel every call in flight (a running task gets KeyboardInterrupt: its temp outputs are
        aborted) and give them CANCEL_WAIT_S to do so before the driver disconnects (Ray then kills the
        job's workers, mid-write); never raises."""
        refs = self.refs()
        for ref in refs:
            try:
                self.ray.cancel(ref, recursive=True)
            except Exception:  # noqa: BLE001
                pass
        if refs:
            try:
                self.ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
            except Exception:  # noqa: BLE001
                pass
        self.running.clear()
        if self.sink is not None:
            try:
                self.ray.kill(self.sink)
            except Exception:  # noqa: BLE001
                pass
            self.sink = None


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def lost_cluster(address: str, finished: int, job: "ShardJob", exc: BaseException) -> JobError:
    return JobError(f"lost the Ray cluster at {address} ({_last_line(exc)}; {finished} tasks finished in this run); "
                    "finished tasks are "
                    f"recorded in the run directory {job.run_dir}: rerun to resume")
