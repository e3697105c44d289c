"""Trying a job on a few samples (`--limit N`): a scratch run that never mixes with the real one.

`trial_job(job, limit, tasks=None)` is the job (job.replace, limit set) whose first `tasks` tasks (all by default)
stop after `limit` input samples each and write into `<outputs folder>/_shardflow-limit-<job>/`:
shards under `shards/` (the real output names), the run directory under `run/`. Every trial starts
afresh (the scratch run directory is reset), so it always shows what the current code does; the real
run directory and outputs are not read or written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardflow.errors import JobError
from shardflow.rundir.layout import scratch_name
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.storage.paths import join

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob



def scratch_folder(job: ShardJob) -> str:
    """Where the trials of `job` write: a folder beside its (first) output."""
    first = job.plan()[0].output
    return join(first.rpartition("/")[0] or ".", scratch_name(job.name))


def _base(url: str) -> str:
    return url.rpartition("/")[2]


def trial_job(job: ShardJob, limit: int, tasks: int | None = None) -> ShardJob:
    """`job` limited to `limit` samples per task over its first `tasks` tasks, writing to scratch."""
    if limit < 1:
        raise JobError("limit must be >= 1 sample per task")
    planned = job.plan()
    if not planned:
        raise JobError("the job has no tasks (its inputs expand to no shard)")
    folder = join(scratch_folder(job), "shards")
    chosen = planned[: tasks or len(planned)]
    names = [_base(t.output) for t in chosen]
    unique = len(set(names)) == len(names)  # outputs in several folders may share base names
    scratch = [
        Task(t.id, t.inputs, join(folder, _base(t.output) if unique else f"{t.id:06d}-{_base(t.output)}"),
             join(folder, _base(t.output_parts) if unique else f"{t.id:06d}-{_base(t.output_parts)}"))
        for t in chosen
    ]
    run_dir = RunDir(join(scratch_folder(job), "run"), job.options_for(scratch_folder(job)))
    # inputs: a prefix of the plan, so that a rebuilt plan gives these tasks again
    trial = job.replace(inputs=[u for t in chosen for u in t.inputs], outputs=[t.output for t in scratch], limit=limit)
    return trial.at_run_dir(run_dir).with_plan(scratch)


def prepare_trial(job: ShardJob, limit: int, tasks: int | None = None) -> tuple[ShardJob, RunDir]:
    """The trial job and its freshly reset scratch run directory, plan written."""
    trial = trial_job(job, limit, tasks)
    run_dir = trial.prepare(redo=True, overwrite=True)  # a redo forgets the last trial's progress
    return trial, run_dir
