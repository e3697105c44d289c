"""Dask backend: `run_task(task, job)` on a Dask cluster, surviving the loss of workers.

    job.run("dask", address="tcp://scheduler:8786")   # an existing cluster
    job.run("dask", client=client)                     # an existing distributed.Client (KubeCluster, SLURMCluster...)
    job.run("dask")                                    # a LocalCluster: one worker process per core

How it works (docs/dask.md has the user's view):

- The job is cloudpickled once and stored on the scheduler once (a dask Variable, so it outlives
  any worker); each worker fetches and unpickles it on its first task and keeps it for the run.
  Tasks carry only a Task value (ids and URLs) and have no dependencies, so the scheduler queues
  them and hands them out in plan order as worker threads free up.
- Only pending task ids are submitted (run_job already skipped the finished ones), at most
  `max_in_flight` at a time (default 3 x the cluster's threads), topped up as results come back, so
  100,000 tasks never sit in the scheduler at once. Each result is released as soon as it is read.
- Workers stream sample counts to the client through Dask's event topics (`Worker.log_event`), so
  the progress bar moves while long tasks run.
- A worker killed mid-task: the scheduler reruns its task elsewhere; run_task is idempotent and its
  outputs atomic, so each task's outputs are published exactly once. A task whose workers keep dying
  (`distributed.scheduler.allowed-failures`) comes back as KilledWorker: reported failed, kind "io".
- The scheduler lost: the run ends with JobError; the run directory keeps every finished task, so
  rerunning the same command resumes.
- Closing the generator (Ctrl-C, on_error="raise") cancels outstanding tasks; a task already
  running notices within about half a second (it checks its state at each progress report), aborts
  its temp outputs and returns.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import logging
import os
import queue
import re
import sys
import threading
import time
import types
import uuid
from concurrent.futures import CancelledError as _FuturesCancelledError
from typing import TYPE_CHECKING, Any, Callable, Iterator

import cloudpickle

from ..errors import JobError
from ..progress import Progress
from ..task import INPUT, IO, USER, Task, TaskResult, run_task

if TYPE_CHECKING:
    from ..job import ShardJob

__all__ = ["execute_dask", "dumps_job", "missing_module_message"]

_DONE, _EVENT = "done", "event"
_STATUS_POLL_S = 1.0  # how often the client checks the scheduler connection while nothing happens
_LIMIT_REFRESH_S = 5.0  # how often the in-flight bound follows the cluster's size (adaptive clusters)


# =================================================================================================
# the job on the wire
# =================================================================================================
def _by_value_modules(fn: Any) -> list[types.ModuleType]:
    """Modules that must travel by value with `fn`: loaded from a file no worker can import by name.

    cloudpickle already sends functions of `__main__` (and of modules missing from sys.modules) by
    value, and job files loaded by `shardflow.jobfile` register themselves by value. What is left is
    a module imported some other way (importlib from a path, a notebook helper): if no sys.path
    entry provides it, a worker could not import it either, so it goes by value too.
    """
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None or name == "__main__" or getattr(module, "__file__", None) is None:
        return []
    top = name.split(".")[0]
    if top in sys.builtin_module_names:
        return []
    try:
        spec = importlib.machinery.PathFinder.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    return [module] if spec is None else []


def dumps_job(job: "ShardJob") -> bytes:
    """The job as bytes for the workers (cloudpickle; see _by_value_modules for what goes by value)."""
    already = cloudpickle.list_registry_pickle_by_value()  # e.g. job files: leave them registered
    registered = [m for m in _by_value_modules(job.fn) if m.__name__ not in already]
    for module in registered:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(job)
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def missing_module_message(worker: str, module: str | None) -> str:
    name = module or "a module"
    return (f"worker {worker} cannot import {name!r} needed by the job: install it in the worker image "
            f"(pip install it on every Dask worker, or add it to the image built from docker/)")


# =================================================================================================
# the worker side
# =================================================================================================
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


_worker_jobs: dict[str, Any] = {}  # token -> job, one entry per worker process (the current run)
_worker_lock = threading.Lock()


def _load_job(token: str, variable: str) -> Any:
    """The run's job on this worker: fetched from the scheduler (a dask Variable) and unpickled once."""
    with _worker_lock:
        job = _worker_jobs.get(token)
        if job is None:
            from distributed import Variable, get_client

            blob = Variable(variable, client=get_client()).get(timeout=120)
            job = cloudpickle.loads(blob)
            job.fn = _ImportGuard(job.fn)
            _worker_jobs.clear()  # keep only the current run's job
            _worker_jobs[token] = job
        return job


class _Reporter:
    """run_task's progress callback on a worker: sends sample counts, and notices cancellation."""

    def __init__(self, topic: str) -> None:
        from distributed import get_worker

        self.topic = topic
        self.worker = get_worker()
        try:
            self.key = self.worker.get_current_task()
        except Exception:  # noqa: BLE001 - only used to notice cancellation
            self.key = None

    def __call__(self, count: int) -> None:
        try:
            self.worker.log_event(self.topic, int(count))
        except Exception:  # noqa: BLE001 - progress is best effort, never a reason to fail a task
            pass
        if self.cancelled():
            raise _Cancelled()

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


def _run_on_worker(task: Task, token: str, variable: str, topic: str) -> TaskResult:
    """What each Dask task runs: the job (fetched and unpickled once per worker), then run_task.

    The result is also sent to the client on the run's event topic, ahead of the task's completion,
    so the client need not fetch it through the scheduler (it still can: the return value)."""
    result = _run(task, token, variable, topic)
    try:
        from distributed import get_worker

        worker = get_worker()
        worker.log_event(topic, {"key": worker.get_current_task(), "result": result_to_json(result)})
    except Exception:  # noqa: BLE001 - the client gathers the return value instead
        pass
    return result


def result_to_json(result: TaskResult) -> dict[str, Any]:
    """A TaskResult as msgpack/JSON-safe data (the inverse of result_from_json)."""
    return {"task_id": result.task_id, "status": result.status, "stats": result.stats.to_json(),
            "outputs": result.outputs, "error": result.error, "kind": result.kind, "attempts": result.attempts}


def result_from_json(data: dict[str, Any]) -> TaskResult:
    from ..stats import Stats

    return TaskResult(int(data["task_id"]), data["status"], Stats.from_json(data["stats"]), list(data["outputs"]),
                      data.get("error"), data.get("kind"), int(data.get("attempts", 1)))


def _run(task: Task, token: str, variable: str, topic: str) -> TaskResult:
    try:
        job = _load_job(token, variable)
    except ModuleNotFoundError as exc:
        return TaskResult(task.id, "failed", error=missing_module_message(_worker_address(), exc.name), kind=USER)
    except Exception as exc:  # noqa: BLE001 - e.g. a class the job pickled that changed shape
        return TaskResult(task.id, "failed", kind=USER,
                          error=f"worker {_worker_address()} cannot load the job: {type(exc).__name__}: {exc} "
                                "(are shardflow, Python and the job's packages the same versions as on the client?)")
    try:
        reporter: Callable[[int], None] | None = _Reporter(topic)
    except Exception:  # noqa: BLE001 - not inside a worker (tests calling this directly)
        reporter = None
    try:
        return run_task(task, job, progress=reporter)
    except _MissingModule as exc:
        message = missing_module_message(_worker_address(), exc.name)
        try:
            job.rundir().mark_failed(task.id, {"task": task.id, "error": message, "kind": USER,
                                               "inputs": list(task.inputs)})
        except Exception:  # noqa: BLE001 - the message still reaches the client
            pass
        return TaskResult(task.id, "failed", error=message, kind=USER)
    except _Cancelled:
        return TaskResult(task.id, "failed", error="cancelled: the run was stopped", kind=IO)


def _worker_check(run_dir_path: str | None) -> dict[str, Any]:
    """Preflight on each worker: can it see the run directory; which shardflow does it have."""
    from .. import __version__

    seen = None if run_dir_path is None else os.path.exists(os.path.join(run_dir_path, "plan.json"))
    return {"sees_run_dir": seen, "shardflow": __version__, "python": sys.version.split()[0]}


# =================================================================================================
# the client side
# =================================================================================================
def _import_distributed() -> Any:
    try:
        import distributed
    except ModuleNotFoundError as exc:
        raise JobError("the dask backend needs dask and distributed: pip install 'shardflow[dask]'") from exc
    return distributed


def _connect(address: str | None, client: Any, workers: int | None, threads_per_worker: int,
             dashboard_address: str | None, connect_timeout: float) -> tuple[Any, Any, str]:
    """(client, cluster or None, scheduler address): ours to close unless the caller passed a client."""
    distributed = _import_distributed()
    if client is not None:
        if address is not None:
            raise JobError("give the dask backend an address or a client, not both")
        return client, None, str(getattr(client, "scheduler", None) and client.scheduler.address)
    if address is not None:
        try:
            client = distributed.Client(address, timeout=connect_timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise JobError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
        return client, None, address
    from .local import default_workers

    import dask

    # worker-saturation 1.0: a worker holds only the tasks it is running, so when a task kills its
    # worker no innocent task queued behind it on that worker is counted towards allowed-failures
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        cluster = distributed.LocalCluster(
            n_workers=workers or default_workers(), threads_per_worker=threads_per_worker, processes=True,
            dashboard_address=dashboard_address,
        )
    try:
        client = distributed.Client(cluster, set_as_default=False)
    except BaseException:
        cluster.close()
        raise
    return client, cluster, cluster.scheduler_address


def _print_dashboard(client: Any) -> None:
    try:
        services = client.scheduler_info().get("services", {})
        link = client.dashboard_link if "dashboard" in services else None
    except Exception:  # noqa: BLE001
        link = None
    if link:
        print(f"shardflow: Dask dashboard at {link}", file=sys.stderr)
    else:
        print("shardflow: no Dask dashboard (pip install bokeh on the scheduler to get one)", file=sys.stderr)


def _preflight(client: Any, job: "ShardJob") -> None:
    """Fail early, and clearly, when workers cannot import shardflow or see a local run directory."""
    from .. import __version__, urls

    local = urls.is_local(job.run_dir)
    path = os.path.abspath(urls.local_path(job.run_dir)) if local else None
    try:
        answers = client.run(_worker_check, path, on_error="return")
    except Exception:  # noqa: BLE001 - a preflight that cannot run must not stop a run that could
        return
    blind = []
    for worker, answer in sorted(answers.items()):
        if isinstance(answer, ModuleNotFoundError):
            raise JobError(missing_module_message(worker, answer.name))
        if not isinstance(answer, dict):
            continue
        if answer.get("sees_run_dir") is False:
            blind.append(worker)
        if answer.get("shardflow") != __version__:
            print(f"shardflow: warning: worker {worker} has shardflow {answer.get('shardflow')}, "
                  f"this client {__version__}", file=sys.stderr)
    if blind:
        raise JobError(
            f"{len(blind)} Dask worker(s) ({', '.join(blind[:3])}{', ...' if len(blind) > 3 else ''}) cannot see the "
            f"run directory {job.run_dir}: put the run directory and the outputs on storage every worker reaches "
            f"(s3://, gs://, or a shared filesystem mounted at the same path), e.g. run_dir='s3://bucket/run'"
        )


def _cluster_threads(client: Any) -> int:
    try:
        return sum(client.nthreads().values())
    except Exception:  # noqa: BLE001
        return 0


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)[:40] or "job"


def _record(job: "ShardJob", task: Task, result: TaskResult) -> TaskResult:
    """Write a failure the workers could not write themselves (the worker died, the job did not load)."""
    try:
        job.rundir().mark_failed(task.id, {"task": task.id, "error": result.error, "kind": result.kind,
                                           "inputs": list(task.inputs)})
    except Exception:  # noqa: BLE001 - the report still carries the failure
        pass
    return result


def execute_dask(job: "ShardJob", tasks: list[Task], progress: Progress, *, address: str | None = None,
                 client: Any = None, workers: int | None = None, threads_per_worker: int = 1,
                 max_in_flight: int | None = None, dashboard_address: str | None = ":8787",
                 connect_timeout: float = 30.0) -> Iterator[TaskResult]:
    """Run tasks on a Dask cluster and yield their results as they finish.

    address:            scheduler address (`tcp://host:8786`) of a running cluster.
    client:             an existing `distributed.Client` (left open; its cluster is used as is).
    neither:            a LocalCluster of `workers` processes (default one per core) x
                        `threads_per_worker` threads, closed at the end.
    max_in_flight:      tasks submitted at once (default 3 x the cluster's threads, at least 4).
    dashboard_address:  where a LocalCluster serves its dashboard.
    connect_timeout:    seconds to wait for the scheduler at `address`.
    """
    if not tasks:
        return  # nothing pending: no cluster to start
    if workers is not None and (address is not None or client is not None):
        print(f"shardflow: workers={workers} ignored: it sizes a LocalCluster, and this run uses the cluster at "
              f"{address or 'the given client'}", file=sys.stderr)
    own_client = client is None
    client, cluster, scheduler = _connect(address, client, workers, threads_per_worker, dashboard_address,
                                          connect_timeout)
    distributed = _import_distributed()
    run_id = uuid.uuid4().hex[:8]
    prefix = f"shardflow-{_safe_name(job.name)}"
    topic = f"{prefix}-events-{run_id}"  # sample counts and results, from the workers
    events: "queue.SimpleQueue[tuple[str, Any]]" = queue.SimpleQueue()
    running: dict[Any, tuple[Any, Task]] = {}
    sent: dict[Any, dict[str, Any]] = {}  # results that arrived as events, by task key
    job_variable = None
    subscribed = False
    try:
        _print_dashboard(client)
        _preflight(client, job)
        blob = dumps_job(job)
        token = hashlib.sha256(blob).hexdigest()[:16]
        # the job goes to the scheduler once; each worker fetches it once, on its first task (workers
        # that join later or replace dead ones too). Tasks carry no dependency, so Dask queues them
        # on the scheduler and hands them out in plan order as worker threads free up.
        job_variable = distributed.Variable(f"{prefix}-job-{run_id}", client=client)
        job_variable.set(blob)
        try:
            client.subscribe_topic(topic, lambda event: events.put((_EVENT, event[1])))
            subscribed = True
        except Exception:  # noqa: BLE001 - no live counts then; results still carry them
            pass

        def on_done(future: Any) -> None:
            events.put((_DONE, future.key))

        remaining = list(reversed(tasks))  # popped from the end: plan order

        def top_up(limit: int, threads: int) -> None:
            """Submit tasks until `limit` are in flight, in one call (one graph update for the
            scheduler), once at least `threads` slots are free or no task is left to wait for."""
            free = limit - len(running)
            if not remaining or free <= 0 or (free < threads and len(running) >= threads):
                return
            batch = [remaining.pop() for _ in range(min(free, len(remaining)))]
            futures = client.map(_run_on_worker, batch, token=token, variable=job_variable.name, topic=topic,
                                 key=[f"{prefix}-{run_id}-{task.id:06d}" for task in batch],
                                 priority=-(len(tasks) - len(remaining)), pure=False, retries=0)
            for future, task in zip(futures, batch):
                running[future.key] = (future, task)
                future.add_done_callback(on_done)

        def size() -> tuple[int, int]:
            threads = max(1, _cluster_threads(client))
            return (max_in_flight or max(4, 3 * threads)), (min(threads, max_in_flight) if max_in_flight else threads)

        (limit, threads), sized_at = size(), time.monotonic()
        top_up(limit, threads)
        finished = 0
        while running:
            if time.monotonic() - sized_at > _LIMIT_REFRESH_S:
                (limit, threads), sized_at = size(), time.monotonic()  # the cluster may have grown or shrunk
                top_up(limit, threads)
            try:
                kind, value = events.get(timeout=_STATUS_POLL_S)
            except queue.Empty:
                if client.status not in ("running", "connecting"):
                    raise _lost(scheduler, finished, len(running), job) from None
                continue
            if kind == _EVENT:
                if isinstance(value, dict):  # a task's result, just ahead of its completion
                    if value.get("key") in running:
                        sent[value["key"]] = value["result"]
                else:
                    progress.add_samples(int(value))
                continue
            entry = running.pop(value, None)
            if entry is None:
                continue
            future, task = entry
            payload = sent.pop(value, None)
            if payload is not None and future.status == "finished":
                result = result_from_json(payload)
            else:
                result = _collect(future, task, job, client, distributed, scheduler, finished, len(running))
            if not subscribed and result.status == "done":
                progress.add_samples(result.stats.samples_in)
            future.release()
            del future, entry
            top_up(limit, threads)
            finished += 1
            yield result
        _drain_samples(events, progress)
    finally:
        _shutdown(client, cluster, own_client, running, job_variable, topic if subscribed else None)


def _drain_samples(events: "queue.SimpleQueue[tuple[str, Any]]", progress: Progress, wait: float = 0.2) -> None:
    """Count the sample events still on their way (the last ones of each task trail its result)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            kind, value = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return
        if kind == _EVENT and not isinstance(value, dict):
            progress.add_samples(int(value))


def _collect(future: Any, task: Task, job: "ShardJob", client: Any, distributed: Any, scheduler: str,
             finished: int, running: int) -> TaskResult:
    """The TaskResult of a finished future, or a failed one saying why the cluster could not run it."""
    try:
        result = future.result()
    except distributed.KilledWorker as exc:
        return _record(job, task, TaskResult(
            task.id, "failed", kind=IO,
            error=f"the workers holding this task died {exc.allowed_failures + 1} times (killed, out of memory or "
                  f"lost; distributed.scheduler.allowed-failures={exc.allowed_failures}), last "
                  f"{getattr(exc.last_worker, 'address', exc.last_worker)}; a rerun retries it"))
    except (_FuturesCancelledError, distributed.client.FutureCancelledError) as exc:
        if client.status != "running" or getattr(exc, "reason", "") == "scheduler-connection-lost":
            raise _lost(scheduler, finished, running + 1, job) from None
        return _record(job, task, TaskResult(task.id, "failed", kind=IO,
                                             error=f"cancelled on the Dask cluster ({getattr(exc, 'reason', exc)})"))
    except ModuleNotFoundError as exc:  # the worker could not even load shardflow's task function
        return _record(job, task, TaskResult(task.id, "failed", kind=USER,
                                             error=missing_module_message("(some worker)", exc.name)))
    except Exception as exc:  # noqa: BLE001 - a bug or an unpicklable result: fail this task visibly
        if client.status not in ("running",):
            raise _lost(scheduler, finished, running + 1, job) from None
        return _record(job, task, TaskResult(task.id, "failed", kind=INPUT,
                                             error=f"Dask task error: {type(exc).__name__}: {exc}"))
    if not isinstance(result, TaskResult):
        return _record(job, task, TaskResult(task.id, "failed", kind=INPUT,
                                             error=f"Dask task returned {type(result).__name__}, not a TaskResult"))
    return result


def _lost(scheduler: str, finished: int, running: int, job: "ShardJob") -> JobError:
    return JobError(
        f"lost the Dask scheduler at {scheduler} ({finished} tasks finished in this run, {running} were running); "
        f"finished tasks are recorded in the run directory {job.run_dir}: rerun to resume"
    )


def _shutdown(client: Any, cluster: Any, own_client: bool, running: dict[Any, tuple[Any, Task]], job_variable: Any,
              topic: str | None) -> None:
    """Stop outstanding tasks, forget our futures, close what we opened. Never raises."""
    futures = [future for future, _ in running.values()]
    connected = getattr(client, "status", None) == "running"
    if futures and connected:
        try:
            client.cancel(futures, reason="shardflow run stopped")
        except Exception:  # noqa: BLE001
            pass
    running.clear()
    if topic is not None and connected:
        try:
            client.unsubscribe_topic(topic)
        except Exception:  # noqa: BLE001
            pass
    if job_variable is not None and connected:
        try:
            job_variable.delete()
        except Exception:  # noqa: BLE001
            pass
    if own_client:
        # a client that lost its scheduler logs the cancelled reconnect attempt as an ERROR with a
        # traceback; the JobError already says what happened, so keep that noise out of the way
        quiet = None if connected else logging.getLogger("distributed.client")
        level = quiet.level if quiet is not None else None
        if quiet is not None:
            quiet.setLevel(logging.CRITICAL)
        try:
            client.close(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        finally:
            if quiet is not None:
                quiet.setLevel(level)
    if cluster is not None:
        try:
            cluster.close(timeout=30)
        except Exception:  # noqa: BLE001
            pass
