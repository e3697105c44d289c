"""Rerun: how a run treats what its run directory already holds, as one value.

The choices reach a run through three front doors: the keywords of `job.run()` / `job.prepare()`, the
flags of `shardflow run` and the other job commands, and the cluster commands that write the plan
(`shardflow k8s|argo|slurm`, `shardflow worker --prepare`). Each door builds a Rerun; `ShardJob.prepare_run`
is the one place that acts on it (the plan checks of job.guard, job.extend, rundir.retry), and which
choices exclude each other is decided here, once, in the same words at every door.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from shardflow.errors import JobError
from shardflow.storage.protocols import STDIO
from shardflow.storage.specs import split_joined

if TYPE_CHECKING:
    from shardflow.rundir.run_dir import RunDir

__all__ = ["Prepared", "Rerun", "stream_of"]


@dataclass(frozen=True)
class Rerun:
    """What to do with the progress and the plan a run directory holds (all False: resume it)."""

    redo: bool = False  # start over: forget all progress, run every task again (`force`: its older name)
    resume_anyway: bool = False  # the job's code changed: keep the tasks the old code finished
    overwrite: bool = False  # replace shards under planned names that no run of this run directory wrote
    extend: bool = False  # the inputs grew: those no stored task has become new tasks (job.extend)
    retry_failed: bool = False  # finished tasks that dropped samples run again (rundir.retry)

    def __post_init__(self) -> None:
        if self.redo and self.extend:
            raise JobError("extend=True (--extend) adds tasks to the stored plan and redo=True (--redo) starts "
                           "over: pass one of them")
        if self.redo and self.retry_failed:
            raise JobError("retry_failed=True (--retry-failed) runs again the finished tasks that dropped samples; "
                           "redo=True (--redo) runs every task again: pass one of them")

    @classmethod
    def of(cls, *, force: bool = False, redo: bool = False, resume_anyway: bool = False, overwrite: bool = False,
           extend: bool = False, retry_failed: bool = False) -> "Rerun":
        """From keywords as every front door spells them (`force`: the older name of `redo`)."""
        return cls(redo=redo or force, resume_anyway=resume_anyway, overwrite=overwrite, extend=extend,
                   retry_failed=retry_failed)

    def for_stream(self, stream: str | None) -> "Rerun":
        """This rerun for a job that reads or writes a stream (`stream`: which one, from `stream_of`; None:
        neither, nothing changes). A stream cannot be resumed: stdin holds new data each run, stdout holds
        only what this run writes, so a stream is never "already done": every run starts over (redo).
        extend and retry_failed build on what an earlier run did, which a stream does not keep: refused."""
        if stream is None:
            return self
        for name, flag in (("extend", "--extend"), ("retry_failed", "--retry-failed")):
            if getattr(self, name):
                raise JobError(f"{name}=True ({flag}) builds on an earlier run, but this job {stream}, a stream "
                               f"that cannot be resumed (every run starts over): drop {flag}")
        return replace(self, redo=True)


def stream_of(inputs: Any, outputs: Any) -> str | None:
    """What a job with these inputs and outputs streams, in words ("reads standard input (-)"), None
    when it reads and writes named shards only: the one test of "a stream, in or out" (Rerun.for_stream)."""
    if outputs == STDIO:
        return "writes standard output (-o -)"
    specs = [inputs] if isinstance(inputs, str) else inputs if isinstance(inputs, (list, tuple)) else []
    if any(part == STDIO for spec in specs if isinstance(spec, str) for part in split_joined(spec)):
        return "reads standard input (-)"
    return None


@dataclass(frozen=True)
class Prepared:
    """What `ShardJob.prepare_run` did: the run directory, and one line for each thing it did beyond
    writing or resuming the plan (tasks added by extend, tasks forgotten for a retry), which the run's
    report and the cluster commands show."""

    run_dir: "RunDir"
    notes: tuple[str, ...] = ()
