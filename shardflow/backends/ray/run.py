"""execute_ray: the Ray backend's entry in the registry (job.backend_registry): connect, check, run, clean up."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from shardflow.backends.groups import GroupSizer
from shardflow.backends.paths import absolute_run_dir, absolute_task
from shardflow.backends.ray.connect import connect, only_this_host, preflight, print_dashboard
from shardflow.backends.ray.resources import DEFAULT_MAX_RETRIES, check_resources, parse_ray_args, task_options
from shardflow.backends.ray.submit import RayRun
from shardflow.backends.wire import dumps_job
from shardflow.job.progress import Progress
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def execute_ray(job: "ShardJob", tasks: list[Task], progress: Progress, *, address: str | None = None,
                workers: int | None = None, gpus_per_worker: int | None = None, memory: float | None = None,
                max_retries: int = DEFAULT_MAX_RETRIES, ray_args: Mapping[str, Any] | None = None,
                runtime_env: dict[str, Any] | None = None, max_in_flight: int | None = None,
                tasks_per_call: int | None = None, include_dashboard: bool | None = None,
                ) -> Iterator[TaskResult]:
    """Run tasks as Ray tasks and yield their results as they finish (docs/ray.md).

    address:          a running cluster: "auto", "HOST:6379", "ray://HOST:10001". Without it the Ray this
                      process is already connected to (ray.init() before), else a local Ray of `workers`
                      CPUs (default one per core), stopped at the end.
    gpus_per_worker:  GPUs per task (num_gpus; default 1 for device="cuda", else 0).
    memory:           bytes of memory each task asks the scheduler for.
    max_retries:      reruns of a task whose worker or node died, or that failed with the transient kind.
    ray_args:         more `.options()` of each Ray task (`--ray-arg KEY=VALUE`); "runtime_env" goes to
                      ray.init when this run connects (the job's code and packages for the nodes).
    max_in_flight:    Ray tasks submitted at once (default 3 x the tasks the cluster runs at once, >= 4).
    tasks_per_call:   shardflow tasks per Ray task (default automatic: backends.groups; 1: never group).
    include_dashboard: for a local Ray: start its dashboard (default: when ray[default] is installed).
    """
    if not tasks:
        return  # nothing pending: no cluster to start
    extra = dict(parse_ray_args(ray_args) or {})
    runtime_env = extra.pop("runtime_env", None) or runtime_env
    sizer = GroupSizer(tasks_per_call)  # a bad value is refused before a cluster starts
    tasks = [absolute_task(t) for t in tasks]  # a Ray worker resolves relative paths in ITS working directory
    job = absolute_run_dir(job)
    options = task_options(job, gpus_per_worker=gpus_per_worker, memory=memory, max_retries=max_retries,
                           ray_args=extra)
    if runtime_env and address is None:
        options["runtime_env"] = runtime_env  # an existing connection: per task; else at ray.init below
    if workers is not None and address is not None:
        print(f"shardflow: workers={workers} ignored: it sizes a local Ray, and this run uses the cluster at "
              f"{address}", file=sys.stderr)
    connection = connect(address, workers, include_dashboard, runtime_env if address is not None else None)
    if connection.started:
        options.pop("runtime_env", None)  # a local Ray shares this machine's files and packages
    run = RayRun(connection.ray, job, tasks, progress, options, max_in_flight, sizer)
    try:
        print_dashboard(connection)
        if not connection.started and not only_this_host(connection):
            preflight(connection, job, tasks)
        check_resources(options, connection.ray.cluster_resources(), autoscaling=not connection.started)
        run.publish(dumps_job(job))
        yield from run.results(connection.address)
    finally:
        run.cancel()
        connection.close()
