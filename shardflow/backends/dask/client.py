"""The client side of the Dask backend: connect, check the workers, run (submit.DaskRun), clean up."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Iterator

from shardflow.backends.dask.resources import check_resources, task_resources
from shardflow.backends.dask.submit import DaskRun, import_distributed
from shardflow.backends.dask.waiting import wait_for_workers
from shardflow.backends.groups import GroupSizer
from shardflow.backends.main_guard import check_main_guard
from shardflow.backends.paths import absolute_run_dir, absolute_task, input_probes
from shardflow.backends.preflight import judge_answers, worker_check
from shardflow.errors import JobError
from shardflow.job.progress import Progress
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

def _connect(address: str | None, client: Any, workers: int | None, threads_per_worker: int,
             dashboard_address: str | None, connect_timeout: float) -> tuple[Any, Any, str]:
    """(client, cluster or None, scheduler address): ours to close unless the caller passed a client."""
    distributed = import_distributed()
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
    cluster = start_local_cluster(workers, threads_per_worker, dashboard_address)
    try:
        client = distributed.Client(cluster, set_as_default=False)
    except BaseException:
        cluster.close()
        raise
    return client, cluster, cluster.scheduler_address


# The LocalCluster shardflow starts (bench/bench_dask.py starts its own with the same settings, so it
# measures what users get):
# - worker-saturation 1.0: a worker holds only the tasks it is running, so when a task kills its
#   worker no innocent task queued behind it on that worker is counted towards allowed-failures;
# - the workers' statistical profiler (a 10 ms sampler sharing the GIL with the tasks) off: 3-7 % of
#   the workers' CPU in every round measured (bench/README.md, Speed);
# - no MALLOC_TRIM_THRESHOLD_ (the nanny's default 65536): setting it turns off glibc's dynamic mmap
#   threshold, so every buffer over 128 KiB (a decoded image, a tensor, a PNG) is a fresh mmap whose
#   pages fault in and are zeroed, and is unmapped when freed. The augment job's workers took ~1/3
#   more CPU with it (12x the page faults, sys time 30 % of their CPU; docs/dask.md). The nannies
#   live in this process and export their variables into it, so they reached later local runs too;
# - the housekeeping of every scheduler, nanny and worker less often: the event loop's health tick
#   (default every 20 ms, for an "unresponsive event loop" warning after 3 s) every second, the system
#   monitor (CPU, memory, network and disk counters for the dashboard, default 500 ms) every 2 s, the
#   memory monitor (pause at 80 %, restart at 95 %, default 100 ms) every 500 ms. An idle LocalCluster
#   of 2 workers burned 8 % of a core with the defaults, ~1.5 % so (bench/README.md, Item 6): CPU a
#   run pays for its whole length, ~1 ms a task for 3,000 tiny tasks at a loaded machine's pace.
LOCAL_CLUSTER_CONFIG = {"distributed.scheduler.worker-saturation": 1.0, "distributed.worker.profile.enabled": False,
                        "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                        "distributed.admin.tick.interval": "1s", "distributed.admin.system-monitor.interval": "2s",
                        "distributed.worker.memory.monitor-interval": "500ms"}


def start_local_cluster(workers: int | None, threads_per_worker: int = 1, dashboard_address: str | None = ":8787",
                        ) -> Any:
    """A LocalCluster of `workers` processes (default one per core) with LOCAL_CLUSTER_CONFIG. Its nannies
    spawn them, and each imports the main script first: one without the main guard is refused here in
    one line (backends.main_guard), not with a traceback from every nanny and "Nanny failed to start"."""
    import dask

    from shardflow.backends.local import default_workers

    distributed = import_distributed()
    check_main_guard("dask backend's LocalCluster")
    with dask.config.set(LOCAL_CLUSTER_CONFIG):
        return distributed.LocalCluster(
            n_workers=workers or default_workers(), threads_per_worker=threads_per_worker, processes=True,
            dashboard_address=dashboard_address,
        )


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
    from shardflow.storage.paths import is_local, local_path

    local = is_local(job.run_dir)
    path = os.path.abspath(local_path(job.run_dir)) if local else None
    try:
        answers = client.run(worker_check, path, input_probes(tasks, job.options_for), on_error="return")
    except Exception:  # noqa: BLE001 - a preflight that cannot run must not stop a run that could
        return
    judge_answers(sorted(answers.items()), "Dask worker", job.run_dir)


def execute_dask(job: "ShardJob", tasks: list[Task], progress: Progress, *, address: str | None = None,
                 client: Any = None, workers: int | None = None, threads_per_worker: int = 1,
                 max_in_flight: int | None = None, dashboard_address: str | None = ":8787",
                 connect_timeout: float = 30.0, wait_workers: float | None = None,
                 gpus_per_worker: int | None = None, tasks_per_call: int | None = None) -> Iterator[TaskResult]:
    """Run tasks on a Dask cluster and yield their results as they finish.

    address:            scheduler address (`tcp://host:8786`) of a running cluster.
    client:             an existing `distributed.Client` (left open; its cluster is used as is).
    neither:            a LocalCluster of `workers` processes (default one per core) x
                        `threads_per_worker` threads, closed at the end.
    max_in_flight:      Dask tasks submitted at once (default 3 x the cluster's threads, at least 4).
    tasks_per_call:     shardflow tasks per Dask task (default: automatic, backends.groups: one
                        each until they are measured, then groups of tiny ones; 1: never group).
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
    sizer = GroupSizer(tasks_per_call)  # a bad value is refused before a cluster starts
    tasks = [absolute_task(t) for t in tasks]  # workers resolve relative paths in THEIR working directory
    job = absolute_run_dir(job)
    own_client = client is None
    client, cluster, scheduler = _connect(address, client, workers, threads_per_worker, dashboard_address,
                                          connect_timeout)
    run = DaskRun(job, tasks, progress, client, scheduler, max_in_flight, sizer)
    run.resources = None if cluster is not None else task_resources(job, gpus_per_worker)
    try:
        _print_dashboard(client)
        wait_for_workers(client, scheduler, wait_workers)
        _preflight(client, job, tasks)
        check_resources(client, run.resources)
        run.publish_job()
        yield from run.results()
    finally:
        _shutdown(client, cluster, own_client, run)


def _shutdown(client: Any, cluster: Any, own_client: bool, run: DaskRun) -> None:
    """Stop outstanding tasks, forget our futures, close what we opened. Never raises."""
    futures, job_variable, topic = run.futures(), run.job_variable, (run.topic if run.subscribed else None)
    connected = getattr(client, "status", None) == "running"
    if futures and connected:
        try:
            client.cancel(futures, reason="shardflow run stopped")
        except Exception:  # noqa: BLE001
            pass
    run.running.clear()
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
