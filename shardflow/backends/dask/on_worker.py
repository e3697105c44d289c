"""The worker side of the Dask backend: what each Dask task runs, in a Dask worker process.

The job is fetched from the scheduler (a dask Variable) and unpickled once per worker process; then
each task is `run_task(task, job)`, with sample counts sent back to the client as Dask events.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import types
from typing import Any, Callable, Iterator

import cloudpickle

from shardflow.backends.wire import missing_module_message
from shardflow.errors import FailureKind
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.task.context import TaskContext
from shardflow.task.run_task import run_task
from shardflow.task.threads import limit_threads, usable_cpus


class _MissingModule(BaseException):
    """The job function needs a module this worker lacks. A BaseException so that run_task does not
    count it as one bad sample: the task stops (its temp outputs aborted) and reports it once."""

    def __init__(self, name: str | None) -> None:
        super().__init__(name)
        self.name = name


class _Cancelled(BaseException):
    """The client no longer wants this task (run stopped): abort it and free the worker."""


class _ImportGuard:
    """Wraps the job's fn on the worker: a ModuleNotFoundError escaping fn stops the task."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "fn")

    def __call__(self, sample: Any) -> Any:
        try:
            result = self.fn(sample)
        except ModuleNotFoundError as exc:
            raise _MissingModule(exc.name) from exc
        if isinstance(result, types.GeneratorType):
            return self._guard(result)
        return result

    @staticmethod
    def _guard(outputs: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from outputs
        except ModuleNotFoundError as exc:
            raise _MissingModule(exc.name) from exc


_worker_jobs: dict[str, TaskContext] = {}  # token -> job, one entry per worker process (the current run)
_worker_lock = threading.Lock()


def _fetch_job(token: str, variable: str) -> TaskContext:
    """What this worker's tasks run with: the run's job fetched from the scheduler (a dask Variable),
    unpickled once, as a TaskContext whose fn is wrapped in the import guard."""
    with _worker_lock:
        job = _worker_jobs.get(token)
        if job is None:
            from distributed import Variable, get_client

            blob = Variable(variable, client=get_client()).get(timeout=120)
            _limit_threads()  # before the job's modules (torch) load: they read the variables
            # the guard wraps fn as made on this worker (a class: once, by run_task)
            job = dataclasses.replace(cloudpickle.loads(blob).task_context(), fn_guard=_ImportGuard)
            _worker_jobs.clear()  # keep only the current run's job
            _worker_jobs[token] = job
        return job


_FLUSH_S = 0.2  # sample counts and results leave a worker at most this often (and at each call's end)


class _Reporter:
    """The link of one Dask task (a group of tasks) to the client: run_task's progress callback, the
    results as tasks finish, and the check for cancellation.

    Counts and results go out together on the run's event topic, at most every _FLUSH_S: a group of
    tiny tasks sends a few events, not two per task, and the results of the tasks it finished reach
    the client even when a later one kills the worker."""

    def __init__(self, topic: str) -> None:
        from distributed import get_worker

        self.topic = topic
        self.worker = get_worker()
        try:
            self.key = self.worker.get_current_task()
        except Exception:  # noqa: BLE001 - only used to notice cancellation
            self.key = None
        self.samples = 0
        self.results: list[tuple[dict[str, Any], float]] = []
        self.sent_at = time.monotonic()

    def __call__(self, count: int) -> None:
        self.samples += int(count)
        self._send_when_due()
        if self.cancelled():
            raise _Cancelled()

    def finished(self, result: TaskResult, seconds: float) -> None:
        self.results.append((result.to_json(), seconds))
        self._send_when_due()

    def _send_when_due(self) -> None:
        if time.monotonic() - self.sent_at >= _FLUSH_S:
            self.send()

    def send(self) -> None:
        if self.samples or self.results:
            try:
                self.worker.log_event(self.topic, {"key": self.key, "samples": self.samples, "results": self.results})
            except Exception:  # noqa: BLE001 - progress is best effort; results also come back as the return value
                pass
        self.samples, self.results, self.sent_at = 0, [], time.monotonic()

    def cancelled(self) -> bool:
        if self.key is None:
            return False
        try:
            state = self.worker.state.tasks.get(self.key)
        except Exception:  # noqa: BLE001 - internal API; if it moves, tasks simply run to the end
            return False
        return state is None or state.state in ("cancelled", "released", "forgotten")


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:  # noqa: BLE001
        return "?"


def run_on_worker(tasks: list[Task], token: str, variable: str, topic: str) -> list[TaskResult]:
    """What each Dask task runs: one task or a group of them (backends.groups), each through run_task
    in turn and recorded alone, as on every backend.

    The group stops early when the run is cancelled or a result ends the run (TaskResult.stops_run):
    its later tasks stay pending. Results also go to the client as events (_Reporter), so the client
    need not fetch them through the scheduler (it still can: the return value)."""
    try:
        job = _fetch_job(token, variable)
    except ModuleNotFoundError as exc:
        return [TaskResult.failed(tasks[0].id, missing_module_message(_worker_address(), exc.name), FailureKind.USER)]
    except Exception as exc:  # noqa: BLE001 - e.g. a class the job pickled that changed shape
        return [TaskResult.failed(tasks[0].id, f"worker {_worker_address()} cannot load the job: "
                                  f"{type(exc).__name__}: {exc} (are shardflow, Python and the job's packages the "
                                  "same versions as on the client?)", FailureKind.USER)]
    try:
        reporter: _Reporter | None = _Reporter(topic)
    except Exception:  # noqa: BLE001 - not inside a worker (tests calling this directly)
        reporter = None
    results: list[TaskResult] = []
    try:
        for task in tasks:
            if reporter is not None and reporter.cancelled():
                break
            started = time.perf_counter()
            results.append(_run(task, job, reporter))
            if reporter is not None:
                reporter.finished(results[-1], time.perf_counter() - started)
            if results[-1].stops_run(job.spec.on_error):
                break
    finally:
        if reporter is not None:
            reporter.send()
    return results


def _run(task: Task, job: TaskContext, reporter: _Reporter | None) -> TaskResult:
    try:
        result = run_task(task, job, progress=reporter)
    except _MissingModule as exc:
        message = missing_module_message(_worker_address(), exc.name)
        try:
            return job.run_dir.record_failure(task, message, FailureKind.USER)
        except Exception:  # noqa: BLE001 - the message still reaches the client
            return TaskResult.failed(task.id, message, FailureKind.USER)
    except _Cancelled:
        return TaskResult.failed(task.id, "cancelled: the run was stopped", FailureKind.IO)
    if result.status == "skipped":
        # only pending tasks are submitted: its marker is from an earlier attempt of this Dask task in
        # this run (a worker that died after finishing it, before its result reached the client)
        result.status = "done"
    return result


def _limit_threads() -> None:
    """Intra-op threads of this worker's tasks: OMP_NUM_THREADS when set (the nanny sets 1), else the
    worker's cores shared among its task threads, so N threads x M cores never run N x M threads."""
    try:
        from distributed import get_worker

        nthreads = max(1, int(get_worker().state.nthreads))
    except Exception:  # noqa: BLE001 - not in a worker (tests calling this directly)
        nthreads = 1
    limit_threads(max(1, usable_cpus() // nthreads))
