"""The registry of backends and manifest front ends: name -> "module:function", imported on first use.

The driver (job/driver.py) and ShardJob.to_kubernetes/to_argo find what runs a job through these tables
rather than importing the layers above them (backends/, cluster/), as fsspec finds its filesystems: the
job layer stays below them, and a plugin (or a later backend: Ray, Slurm) adds itself with one entry.

A backend is a generator `execute(job, tasks, progress, **options)` that yields TaskResults as tasks
finish; closing the generator must stop outstanding work. A front end is `render(job, kind, image,
prepare=..., **options) -> str`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from shardflow.errors import JobError

BACKENDS: dict[str, str] = {
    "serial": "shardflow.backends.local:execute_serial",
    "processes": "shardflow.backends.local:execute_processes",
    "dask": "shardflow.backends.dask.client:execute_dask",
    "ray": "shardflow.backends.ray.run:execute_ray",
    "slurm": "shardflow.cluster.slurm.waiting:execute_slurm",  # a job array; follows the run directory
}
FRONT_ENDS: dict[str, str] = {
    "kubernetes": "shardflow.cluster.manifests:render",
    "argo": "shardflow.cluster.manifests:render",
    "slurm": "shardflow.cluster.slurm:render_job",  # an sbatch script (job.to_slurm)
}


def register_backend(name: str, entry: str) -> None:
    """Add (or replace) a backend: `entry` is "package.module:function"."""
    _check_entry(entry)
    BACKENDS[name] = entry


def backend(name: str) -> Callable[..., Any]:
    """The execute function of backend `name` (its module imported now)."""
    return _load(BACKENDS, name, "backend")


def front_end(kind: str) -> Callable[..., str]:
    """The renderer of manifests of `kind` ("kubernetes", "argo")."""
    return _load(FRONT_ENDS, kind, "manifest kind")


def _check_entry(entry: str) -> None:
    module, sep, func = entry.partition(":")
    if not (module and sep and func):
        raise JobError(f"a registry entry is 'package.module:function', not {entry!r}")


def _load(table: dict[str, str], name: str, what: str) -> Callable[..., Any]:
    try:
        module, func = table[name].split(":")
    except KeyError:
        raise JobError(f"unknown {what} {name!r}; choose one of {', '.join(table)}") from None
    return getattr(importlib.import_module(module), func)
