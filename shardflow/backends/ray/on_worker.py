"""The worker side of the Ray backend: what each Ray task runs, in a Ray worker process.

The job travels once per run (`ray.put` of its cloudpickle, the same bytes the Dask backend sends) and
is unpickled once per worker process: the object ref reaches the task inside a list, so Ray hands over
the ref, not the value, and this module keeps the unpickled job keyed by the ref until a new run's
arrives. Ray reuses its worker processes for every task of a job, so a class fn or a job file's
`setup()` is made once per worker process too (task.worker_fn keeps it per process).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from shardflow.backends.wire import missing_module_message
from shardflow.errors import FailureKind
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.task.context import TaskContext
from shardflow.task.run_task import run_task
from shardflow.task.threads import limit_threads

_FLUSH_S = 0.2  # sample counts leave a worker at most this often (and at each task's end)

_jobs: dict[str, TaskContext] = {}  # object ref (hex) -> the job's TaskContext: the current run's only
_lock = threading.Lock()


class TransientFailure(Exception):
    """Raised at the end of a Ray task when one of its tasks failed with the transient kind (`io`):
    the one exception the Ray task is retried for (`retry_exceptions=[TransientFailure]`). It carries
    every result of the call, so that when Ray's retries are spent the driver still reports them."""

    def __init__(self, results: list[tuple[dict[str, Any], float]]) -> None:
        super().__init__(results)
        self.results = results

    def __reduce__(self) -> tuple[Any, ...]:
        return (TransientFailure, (self.results,))


def _job(box: list[Any]) -> TaskContext:
    """The run's job, fetched from the object store and unpickled once per worker process."""
    import cloudpickle
    import ray

    key = box[0].hex()
    with _lock:
        job = _jobs.get(key)
        if job is None:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
            limit_threads(max(1, int(cpus)))  # before the job's modules (torch) load: they read the variables
            job = cloudpickle.loads(ray.get(box[0])).task_context()
            _jobs.clear()  # keep only the current run's job
            _jobs[key] = job
        return job


class _Counts:
    """run_task's progress callback: sample counts to the driver's ProgressSink, at most every _FLUSH_S."""

    def __init__(self, sink: Any, task_id: int) -> None:
        self.sink, self.task_id, self.samples, self.sent_at = sink, task_id, 0, time.monotonic()

    def __call__(self, count: int) -> None:
        self.samples += int(count)
        if time.monotonic() - self.sent_at >= _FLUSH_S:
            self.send()

    def send(self) -> None:
        if self.samples and self.sink is not None:
            try:
                self.sink.add.remote(self.task_id, self.samples)
            except Exception:  # noqa: BLE001 - progress is best effort; the result carries the counts
                pass
        self.samples, self.sent_at = 0, time.monotonic()


def _node() -> str:
    try:
        import ray

        return f"Ray node {ray.get_runtime_context().get_node_id()[:12]}"
    except Exception:  # noqa: BLE001
        return "a Ray worker"


def run_on_ray(tasks: list[Task], box: list[Any], sink: Any) -> list[tuple[dict[str, Any], float]]:
    """What each Ray task runs: one task or a group (backends.groups), each through run_task alone.

    Returns (result as JSON, seconds) per task run. The group stops early at a result that ends the
    run (TaskResult.stops_run). A task that failed with the transient kind makes the whole call raise
    TransientFailure after the others ran, so Ray retries it (its finished tasks are skipped then)."""
    try:
        job = _job(box)
    except ModuleNotFoundError as exc:
        return [(TaskResult.failed(tasks[0].id, missing_module_message(_node(), exc.name), FailureKind.USER).to_json(),
                 0.0)]
    except Exception as exc:  # noqa: BLE001 - e.g. a class the job pickled that changed shape
        return [(TaskResult.failed(tasks[0].id, f"{_node()} cannot load the job: {type(exc).__name__}: {exc} (are "
                                   "shardflow, Python and the job's packages the same versions as on the driver?)",
                                   FailureKind.USER).to_json(), 0.0)]
    results: list[tuple[dict[str, Any], float]] = []
    transient = False
    for task in tasks:
        started = time.perf_counter()
        counts = _Counts(sink, task.id)
        result = run_task(task, job, progress=counts)
        counts.send()
        if result.status == "skipped":
            # only pending tasks are submitted: its marker is from an earlier attempt of this Ray task
            # (a worker that died, or a retry, after finishing it)
            result.status = "done"
        results.append((result.to_json(), time.perf_counter() - started))
        transient = transient or (result.status == "failed" and result.kind == FailureKind.IO)
        if result.stops_run(job.spec.on_error):
            break
    if transient:
        raise TransientFailure(results)
    return results


def node_check(run_dir_path: str | None, probes: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """Preflight on one node: backends.preflight.worker_check (run directory, inputs, version)."""
    from shardflow.backends.preflight import worker_check

    return worker_check(run_dir_path, probes)
