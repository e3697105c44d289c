"""Reaching a Ray cluster: connect to one (an address, or the one this process already joined), or start
a local one and stop it at the end, as the Dask backend does with a LocalCluster; the dashboard link;
the preflight that every node sees the run directory and the inputs."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardflow.backends.paths import input_probes
from shardflow.backends.preflight import judge_answers
from shardflow.backends.ray.on_worker import node_check
from shardflow.errors import JobError
from shardflow.rundir.tasks import Task

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

PREFLIGHT_TIMEOUT_S = 120.0  # a node that cannot start a worker in this time is left to the run itself


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise JobError("the ray backend needs ray: pip install 'shardflow[ray]'") from exc
    return ray


@dataclass
class Connection:
    """The cluster a run uses: `started` (a local Ray this run started: stop it at the end), `joined`
    (this run connected: disconnect at the end), neither (the caller's connection: leave it)."""

    ray: Any
    address: str
    dashboard: str | None
    started: bool
    joined: bool

    def close(self) -> None:
        if self.started or self.joined:
            try:
                self.ray.shutdown()
            except Exception:  # noqa: BLE001 - never mask the run's own outcome
                pass


def connect(address: str | None, workers: int | None, include_dashboard: bool | None,
            runtime_env: dict[str, Any] | None) -> Connection:
    """Join the cluster at `address` ("auto", "HOST:PORT", "ray://HOST:10001"), keep the connection this
    process already has, or start a local Ray of `workers` CPUs (default one per core)."""
    ray = import_ray()
    if ray.is_initialized():
        if address is not None:
            raise JobError(f"this process is already connected to a Ray cluster ({_address(ray)}): call "
                           "ray.shutdown() first, or run without address to use that one")
        return Connection(ray, _address(ray), _dashboard_of(ray, None), started=False, joined=False)
    quiet = {"logging_level": logging.WARNING, "runtime_env": runtime_env}
    if address is not None:
        try:
            context = ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
            raise JobError(f"cannot reach the Ray cluster at {address}: {str(exc).strip().splitlines()[-1]}") from None
        return Connection(ray, address, _dashboard_of(ray, context), started=False, joined=True)
    from shardflow.backends.local import default_workers

    # address="local": a new Ray of our own, even where `ray start` left a cluster on this machine
    context = ray.init(address="local", num_cpus=workers or default_workers(), include_dashboard=include_dashboard,
                       **quiet)
    return Connection(ray, _address(ray), _dashboard_of(ray, context), started=True, joined=False)


def _address(ray: Any) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001
        return "?"


def _dashboard_of(ray: Any, context: Any) -> str | None:
    url = getattr(context, "dashboard_url", None) if context is not None else None
    if not url:
        try:
            url = ray._private.worker.get_dashboard_url()  # the connection this process already had
        except Exception:  # noqa: BLE001
            url = None
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def print_dashboard(connection: Connection) -> None:
    if connection.dashboard:
        print(f"shardflow: Ray dashboard at {connection.dashboard}", file=sys.stderr)
    else:
        print("shardflow: no Ray dashboard (pip install 'ray[default]' where the head runs to get one)",
              file=sys.stderr)


def only_this_host(connection: Connection) -> bool:
    """Whether every live node is this machine (ray.init() here): it sees what the driver sees."""
    ray = connection.ray
    try:
        here = ray.util.get_node_ip_address()
        return all(n["NodeManagerAddress"] == here for n in ray.nodes() if n.get("Alive"))
    except Exception:  # noqa: BLE001 - cannot tell: check
        return False


def preflight(connection: Connection, job: "ShardJob", tasks: list[Task]) -> None:
    """On every live node, once: can it import shardflow, see the run directory and the inputs? A
    node that cannot stops the run with one message instead of failing every task."""
    from shardflow.storage.paths import is_local, local_path

    ray = connection.ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    path = os.path.abspath(local_path(job.run_dir)) if is_local(job.run_dir) else None
    probes = input_probes(tasks, job.options_for)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    check = ray.remote(node_check)
    refs = {n["NodeManagerAddress"] + " " + n["NodeID"][:12]: check.options(
        num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
    ).remote(path, probes) for n in nodes}
    answers = []
    for node, ref in refs.items():
        try:
            answers.append((node, ray.get(ref, timeout=PREFLIGHT_TIMEOUT_S)))
        except ray.exceptions.RayTaskError as exc:
            answers.append((node, getattr(exc, "cause", None)))  # a ModuleNotFoundError is judged
        except Exception:  # noqa: BLE001 - a preflight that cannot run must not stop a run that could
            continue
    judge_answers(answers, "Ray node", job.run_dir)
