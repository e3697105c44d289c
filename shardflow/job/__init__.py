"""The job: its settings as one value (JobSpec), ShardJob (a function plus that value), its plan, its
files, and the driver that runs it on a backend found through the backend registry.

`shardflow.job.ShardJob` is also the name shardflow 0.1.0 pickled jobs under (job.pkl): it resolves
lazily so that importing a module of this package does not import the whole job layer.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "ShardJob":
        from shardflow.job.shard_job import ShardJob

        return ShardJob
    raise AttributeError(f"module 'shardflow.job' has no attribute {name!r}")
