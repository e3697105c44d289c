"""Slurm job arrays for planned shardflow jobs (docs/slurm.md).

    script = render_job(job, partition="gpu", time="4:00:00", cpus_per_task=4, shared_fs=True)
    job.to_slurm(...)            # the same, through job.backend_registry's FRONT_ENDS
    job.run("slurm", ...)        # submit and wait (waiting.execute_slurm, a backend)

options.py holds the settings and the run-directory check, script.py the sbatch script, queue.py the
Slurm commands, submit.py the submission (resuming), waiting.py the backend that follows a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardflow.cluster.slurm.options import SlurmOptions, from_job
from shardflow.cluster.slurm.script import render
from shardflow.job.rerun import Rerun

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

__all__ = ["SlurmOptions", "from_job", "render", "render_job"]


def render_job(job: "ShardJob", kind: str = "slurm", image: str | None = None, *, prepare: bool = True,
               force: bool = False, shared_fs: bool = False, **options: Any) -> str:
    """The sbatch script of `job` (writing its plan to the run directory first with `prepare`).

    The front-end signature of job.backend_registry; `image`, when given, is the pyxis/enroot
    container (the same as `container=`).
    """
    if image is not None:
        options.setdefault("container", image)
    return render(from_job(job, prepare=prepare, rerun=Rerun.of(force=force), shared_fs=shared_fs, **options))
