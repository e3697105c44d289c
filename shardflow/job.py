"""Compatibility: run directories written by shardflow 0.1.0 pickle the job as `shardflow.job.ShardJob`.

New code imports `shardflow.ShardJob` (defined in `shardflow.run.job`); this module only lets
`job.pkl` files of 0.1.0 load and resume.
"""

from shardflow.run.job import ShardJob

__all__ = ["ShardJob"]
