"""job.pkl files written before the job was a value still load: the class is found where it lives now
(jobrecord.MOVED) and its old attribute state becomes a JobSpec (ShardJob.__setstate__)."""

from __future__ import annotations

import pickle
import sys
import types

from shardflow.job.jobrecord import MOVED, load_job_pickle
from shardflow.job.shard_job import UNLIMITED, ShardJob
from shardflow.task.spec import JobSpec


def _flip(sample):
    return sample


def _old_pickle() -> bytes:
    """What the previous release's driver wrote: `shardflow.run.job.ShardJob` with every setting an attribute."""
    module = types.ModuleType("shardflow.run.job")

    class OldShardJob:
        pass

    OldShardJob.__module__, OldShardJob.__qualname__, OldShardJob.__name__ = module.__name__, "ShardJob", "ShardJob"
    module.ShardJob = OldShardJob
    job = OldShardJob()
    job.__dict__.update(
        fn=_flip, inputs="in/a-{0..3}.tar", outputs="out/{name}.tar", decode="rgb8", encode={"png_compress_level": 3},
        on_error="warn", seed=7, maxcount=UNLIMITED, maxsize=float(UNLIMITED), inputs_per_task=2,
        storage_options=None, max_failure_rate=0.25, io_retries=1, retry_backoff=0.5, allow_pickle=False,
        allow_pipe=False, name="flip", params={"x": 1}, batch_size=4, collate=False, device="cpu",
        _per_worker=None, _identity="abc", _tasks=None, _decoder=None, _encoder=None, _run_dir_url=None,
        _rundir=None, limit=None,
    )
    sys.modules[module.__name__] = module
    try:
        return pickle.dumps(job)
    finally:
        del sys.modules[module.__name__]


def test_a_job_pickled_by_the_previous_layout_loads_as_a_value():
    assert "shardflow.run" not in sys.modules and MOVED["shardflow.run.job"] == "shardflow.job.shard_job"
    job = load_job_pickle(_old_pickle())
    assert isinstance(job, ShardJob) and isinstance(job.spec, JobSpec)
    assert job.spec == JobSpec(inputs="in/a-{0..3}.tar", outputs="out/{name}.tar", decode="rgb8",
                               encode={"png_compress_level": 3}, on_error="warn", seed=7, inputs_per_task=2,
                               max_failure_rate=0.25, io_retries=1, retry_backoff=0.5, name="flip",
                               params={"x": 1}, batch_size=4, device="cpu")
    assert job.spec.maxcount is None and job.spec.rollover == (UNLIMITED, float(UNLIMITED))
    assert job.fn is _flip and job.replace(seed=8).spec.seed == 8
