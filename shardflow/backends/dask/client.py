"""The client side of the Dask backend: connect, check the workers, submit tasks, collect results."""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import queue
import re
import sys
import time
import uuid
from concurrent.futures import CancelledError as _FuturesCancelledError
from typing import TYPE_CHECKING, Any, Iterator

from shardflow.backends.dask.on_worker import run_on_worker, worker_check
from shardflow.backends.dask.paths import absolute, absolute_task, input_probes
from shardflow.backends.dask.resources import check_resources, task_resources
from shardflow.backends.dask.waiting import wait_for_workers
from shardflow.backends.dask.wire import dumps_job, missing_module_message
from shardflow.errors import FailureKind, JobError
from shardflow.run.progress import Progress
from shardflow.run.task import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.run.job import ShardJob

_DONE, _EVENT = "done", "event"
_STATUS_POLL_S = 1.0  # how often the client checks the scheduler connection while nothing happens
_LIMIT_REFRESH_S = 5.0  # how often the in-flight bound follows the cluster's size (adaptive clusters)


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
    import dask

    from shardflow.backends.local import default_workers

    # worker-saturation 1.0: a worker holds only the tasks it is running, so when a task kills its
    # worker no innocent task queued behind it on that worker is counted towards allowed-failures.
    # The workers' statistical profiler (a 10 ms sampler sharing the GIL with the tasks) is off on the
    # clusters started here: 3-7 % of the workers' CPU in every round measured (bench/README.md, Speed)
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0,
                          "distributed.worker.profile.enabled": False}):
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


def _preflight(client: Any, job: "ShardJob", tasks: list[Task]) -> None:
    """Fail early, and clearly, when workers cannot import shardflow or see the run directory or inputs."""
    from shardflow import __version__
    from shardflow.storage.paths import is_local, local_path

    local = is_local(job.run_dir)
    path = os.path.abspath(local_path(job.run_dir)) if local else None
    try:
        answers = client.run(worker_check, path, input_probes(tasks, job.options_for), on_error="return")
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
        if answer.get("blind_inputs"):
            raise JobError(f"Dask worker {worker} cannot see the inputs ({'; '.join(answer['blind_inputs'][:3])}): "
                           "put them on storage every worker reaches (s3://, gs://, or a shared filesystem mounted "
                           "at the same path), and give the workers its credentials")
        if answer.get("shardflow") != __version__:
            print(f"shardflow: warning: worker {worker} has shardflow {answer.get('shardflow')}, "
                  f"this client {__version__}", file=sys.stderr)
    if blind:
        raise JobError(
            f"{len(blind)} Dask worker(s) ({', '.join(blind[:3])}{', ...' if len(blind) > 3 else ''}) cannot see the "
            f"run directory {job.run_dir}: put the run directory and the outputs on storage every worker reaches "
            f"(s3://, gs://, or a shared filesystem mounted at the same path), e.g. run_dir='s3://bucket/run'"
        )


def _absolute_run_dir(job: "ShardJob") -> "ShardJob":
    """The job (a copy) bound to its run directory's absolute path, when that is a relative local path."""
    url = absolute(job.run_dir)
    if url == job.run_dir:
        return job
    from shardflow.run.rundir import RunDir

    job = copy.copy(job)
    job.bind_run_dir(RunDir(url, job.options_for(url)))
    return job


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
        job.rundir().record_failure(task, result.error or "", result.kind or FailureKind.IO)
    except Exception:  # noqa: BLE001 - the report still carries the failure
        pass
    return result


def execute_dask(job: "ShardJob", tasks: list[Task], progress: Progress, *, address: str | None = None,
                 client: Any = None, workers: int | None = None, threads_per_worker: int = 1,
                 max_in_flight: int | None = None, dashboard_address: str | None = ":8787",
                 connect_timeout: float = 30.0, wait_workers: float | None = None,
                 gpus_per_worker: int | None = None) -> Iterator[TaskResult]:
    """Run tasks on a Dask cluster and yield their results as they finish.

    address:            scheduler address (`tcp://host:8786`) of a running cluster.
    client:             an existing `distributed.Client` (left open; its cluster is used as is).
    neither:            a LocalCluster of `workers` processes (default one per core) x
                        `threads_per_worker` threads, closed at the end.
    max_in_flight:      tasks submitted at once (default 3 x the cluster's threads, at least 4).
    dashboard_address:  where a LocalCluster serves its dashboard.
    connect_timeout:    seconds to wait for the scheduler at `address`.
    wait_workers:       seconds to wait for a first worker (default: for ever, saying so on stderr).
    gpus_per_worker:    GPUs each task asks for as the worker resource "GPU" (default 1 for
                        device="cuda"; only on a cluster given by address or client): docs/gpu.md.
    """
    if not tasks:
        return  # nothing pending: no cluster to start
    if workers is not None and (address is not None or client is not None):
        print(f"shardflow: workers={workers} ignored: it sizes a LocalCluster, and this run uses the cluster at "
              f"{address or 'the given client'}", file=sys.stderr)
    tasks = [absolute_task(t) for t in tasks]  # workers resolve relative paths in THEIR working directory
    job = _absolute_run_dir(job)
    own_client = client is None
    client, cluster, scheduler = _connect(address, client, workers, threads_per_worker, dashboard_address,
                                          connect_timeout)
    run = _DaskRun(job, tasks, progress, client, scheduler, max_in_flight)
    run.resources = None if cluster is not None else task_resources(job, gpus_per_worker)
    try:
        _print_dashboard(client)
        wait_for_workers(client, scheduler, wait_workers)
        _preflight(client, job, tasks)
        check_resources(client, run.resources)
        run.publish_job()
        yield from run.results()
    finally:
        _shutdown(client, cluster, own_client, run.running, run.job_variable, run.topic if run.subscribed else None)


class _DaskRun:
    """One run on a Dask cluster: the job published once, tasks submitted in bounded batches in plan
    order, results and live sample counts received as Dask events."""

    def __init__(self, job: "ShardJob", tasks: list[Task], progress: Progress, client: Any, scheduler: str,
                 max_in_flight: int | None) -> None:
        self.job, self.tasks, self.progress, self.client, self.scheduler = job, tasks, progress, client, scheduler
        self.max_in_flight = max_in_flight
        self.distributed = _import_distributed()
        run_id = uuid.uuid4().hex[:8]
        self.prefix = f"shardflow-{_safe_name(job.name)}-{run_id}"
        self.topic = f"shardflow-{_safe_name(job.name)}-events-{run_id}"  # sample counts and results
        self.events: "queue.SimpleQueue[tuple[str, Any]]" = queue.SimpleQueue()
        self.running: dict[Any, tuple[Any, Task]] = {}
        self.sent: dict[Any, dict[str, Any]] = {}  # results that arrived as events, by task key
        self.remaining = list(reversed(tasks))  # popped from the end: plan order
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

    def _size(self) -> tuple[int, int]:
        """(tasks to keep in flight, free slots worth a submission) for the cluster's current size."""
        threads = max(1, _cluster_threads(self.client))
        limit = self.max_in_flight or max(4, 3 * threads)
        return limit, (min(threads, self.max_in_flight) if self.max_in_flight else threads)

    def _top_up(self, limit: int, threads: int) -> None:
        """Submit tasks until `limit` are in flight, in one call (one graph update for the scheduler),
        once at least `threads` slots are free or no task is left to wait for. Tasks carry no
        dependency, so Dask queues them and hands them out in plan order as worker threads free up."""
        free = limit - len(self.running)
        if not self.remaining or free <= 0 or (free < threads and len(self.running) >= threads):
            return
        batch = [self.remaining.pop() for _ in range(min(free, len(self.remaining)))]
        futures = self.client.map(
            run_on_worker, batch, token=self.token, variable=self.job_variable.name, topic=self.topic,
            key=[f"{self.prefix}-{task.id:06d}" for task in batch],
            priority=-(len(self.tasks) - len(self.remaining)), pure=False, retries=0, resources=self.resources)
        for future, task in zip(futures, batch):
            self.running[future.key] = (future, task)
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
                    raise _lost(self.scheduler, finished, len(self.running), self.job) from None
                continue
            result = self._on_event(kind, value, finished)
            if result is None:
                continue
            self._top_up(limit, threads)
            finished += 1
            yield result
        _drain_samples(self.events, self.progress)

    def _on_event(self, kind: str, value: Any, finished: int) -> TaskResult | None:
        """A sample count or an early result (None), or a finished task's TaskResult."""
        if kind == _EVENT:
            if isinstance(value, dict):  # a task's result, just ahead of its completion
                if value.get("key") in self.running:
                    self.sent[value["key"]] = value["result"]
            else:
                self.progress.add_samples(int(value))
            return None
        entry = self.running.pop(value, None)
        if entry is None:
            return None
        future, task = entry
        payload = self.sent.pop(value, None)
        if payload is not None and future.status == "finished":
            result = TaskResult.from_json(payload)
        else:
            result = _collect(future, task, self.job, self.client, self.distributed, self.scheduler, finished,
                              len(self.running))
        if not self.subscribed and result.status == "done":
            self.progress.add_samples(result.stats.samples_in)
        future.release()
        return result


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
            task.id, "failed", kind=FailureKind.IO,
            error=f"the workers holding this task died {exc.allowed_failures + 1} times (killed, out of memory or "
                  f"lost; distributed.scheduler.allowed-failures={exc.allowed_failures}), last "
                  f"{getattr(exc.last_worker, 'address', exc.last_worker)}; a rerun retries it"))
    except (_FuturesCancelledError, distributed.client.FutureCancelledError) as exc:
        if client.status != "running" or getattr(exc, "reason", "") == "scheduler-connection-lost":
            raise _lost(scheduler, finished, running + 1, job) from None
        return _record(job, task, TaskResult(task.id, "failed", kind=FailureKind.IO,
                                             error=f"cancelled on the Dask cluster ({getattr(exc, 'reason', exc)})"))
    except ModuleNotFoundError as exc:  # the worker could not even load shardflow's task function
        return _record(job, task, TaskResult(task.id, "failed", kind=FailureKind.USER,
                                             error=missing_module_message("(some worker)", exc.name)))
    except Exception as exc:  # noqa: BLE001 - a bug or an unpicklable result: fail this task visibly
        if client.status not in ("running",):
            raise _lost(scheduler, finished, running + 1, job) from None
        return _record(job, task, TaskResult(task.id, "failed", kind=FailureKind.INPUT,
                                             error=f"Dask task error: {type(exc).__name__}: {exc}"))
    if not isinstance(result, TaskResult):
        return _record(job, task, TaskResult(task.id, "failed", kind=FailureKind.INPUT,
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
