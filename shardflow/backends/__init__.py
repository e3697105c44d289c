"""Backends: where run_task runs (serial and processes in local.py, dask/). The driver finds each through
the registry in shardflow.job.backend_registry, by name, as fsspec finds its filesystems."""
