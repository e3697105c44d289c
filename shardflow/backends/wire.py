"""What travels from the driver to cluster workers (Dask, Ray): the pickled job, and the message for a
module a worker lacks. One owner for both cluster backends (neither imports the other's folder)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import TYPE_CHECKING, Any

import cloudpickle

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def _by_value_modules(fn: Any) -> list[types.ModuleType]:
    """Modules that must travel by value with `fn`: loaded from a file no worker can import by name.

    cloudpickle already sends functions of `__main__` (and of modules missing from sys.modules) by
    value, and job files loaded by `shardflow.job.jobfile` register themselves by value. What is left is
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
            f"(pip install it on every worker, or add it to the image built from docker/)")
