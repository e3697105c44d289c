"""Submitting a planned run: the job array over the chunks that still have work, then its finalize job.

Run again, it resumes: the array covers only the indexes with a task not marked done (outputs already
written are skipped, never written twice), and a run still queued or running is refused instead of
submitted twice (two arrays would redo each other's chunks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from shardflow.cluster.slurm import queue
from shardflow.cluster.slurm.options import SlurmOptions
from shardflow.cluster.slurm.script import STEP_ENV, array_spec, render
from shardflow.errors import JobError
from shardflow.storage.paths import is_local, local_path

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


@dataclass(frozen=True)
class Submission:
    """What was submitted: the array job (None when nothing was pending) and the finalize job."""

    array_id: str | None
    finalize_id: str
    indexes: tuple[int, ...]  # the array indexes submitted

    @property
    def job_ids(self) -> list[str]:
        return [i for i in (self.array_id, self.finalize_id) if i is not None]

    def __str__(self) -> str:
        if self.array_id is None:
            return f"nothing left to run; finalize job {self.finalize_id} writes summary.json"
        return (f"array job {self.array_id} ({len(self.indexes)} array tasks), finalize job {self.finalize_id} "
                "(afterany: writes summary.json)")


def submit(opts: SlurmOptions, pending_task_ids: Iterable[int]) -> Submission:
    """sbatch the array over the chunks holding `pending_task_ids`, then the dependent finalize job."""
    busy = queue.queued_for(opts.run_dir)
    if busy:
        raise JobError(f"run directory {opts.run_dir} is already being run by Slurm job(s) {', '.join(busy)}: wait "
                       f"for them (squeue -j {','.join(busy)}) or scancel them before submitting again")
    script = render(opts)
    if opts.log_dir and is_local(opts.log_dir):  # Slurm opens the log there and does not create folders
        os.makedirs(local_path(opts.log_dir), exist_ok=True)
    indexes = tuple(opts.chunk_indexes(sorted(pending_task_ids)))
    array_id = None
    dependency: list[str] = []
    if indexes:
        array_id = queue.sbatch(script, [f"--array={array_spec(opts, indexes)}",
                                         f"--comment={queue.COMMENT_PREFIX}{opts.run_dir}"])
        dependency = [f"--dependency=afterany:{array_id}"]
    try:
        finalize_id = queue.sbatch(script, [*dependency, "--array=0", f"--export=ALL,{STEP_ENV}=finalize",
                                            f"--job-name={opts.name}-finalize",
                                            f"--comment={queue.FINALIZE_COMMENT_PREFIX}{opts.run_dir}"])
    except JobError:
        if array_id is not None:  # no array without its summary step: take it back, say why
            queue.scancel([array_id])
        raise
    return Submission(array_id, finalize_id, indexes)


def resume(job: "ShardJob", opts: SlurmOptions) -> Submission:
    """`shardflow slurm --submit`: the chunks of the prepared run with a task not yet done (all, at first)."""
    done = job.rundir().done_ids()
    return submit(opts, [i for i in range(opts.tasks) if i not in done])
