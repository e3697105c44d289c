"""shardflow: resumable, atomic, shard-parallel transforms of WebDataset tar shards.

This is the designed public surface: what a user calls, and nothing else. A job (ShardJob, ShellJob,
load_job), its settings (JobSpec; running_spec() inside a running task) and what its run returns
(RunReport); reading for training (ShardDataset, Loader); reading and
writing shards in a script (read_samples, iter_samples, TarWriter, ShardWriter, RecordWriter, the
ShardInfo receipts they return, load_spec); the seed and device helpers a job function calls
(sample_rng, sample_seed, device_rng, worker_device); every error a user can catch; user codecs
(register_codec, Decoder, Encoder); `__version__`. The machinery under a run (tasks, run_task, the run
directory, tar members) stays in its modules: importing it from here would make it an API to keep.

The job layer and the torch reader load on first use (module `__getattr__`), so that `import
shardflow` stays fast on a worker that only re-shards and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from shardflow.errors import (
    DecodeError,
    EncodeError,
    FormatError,
    JobError,
    PipeError,
    SampleError,
    ShardflowError,
    ShardflowWarning,
    ShardIOError,
    SkipSample,
)
from shardflow.shards.keys import split_name
from shardflow.shards.record_write import RecordWriter
from shardflow.shards.samples import iter_samples, read_samples
from shardflow.shards.spec import SpecError, load_spec
from shardflow.shards.writer import ShardInfo, ShardWriter, TarWriter
from shardflow.storage.schemes import open_read, open_write
from shardflow.storage.specs import expand
from shardflow.version import __version__

# name -> the module that defines it, imported when the name is first used
_LAZY = {
    "ShardJob": "shardflow.job.shard_job",
    "JobSpec": "shardflow.task.spec",  # a job's settings as one value (job.spec)
    "running_spec": "shardflow.task.context",  # the running task's settings, read by a job's function
    "ShellJob": "shardflow.job.shell",
    "load_job": "shardflow.job.jobfile",
    "RunReport": "shardflow.rundir.report",  # what job.run() returns
    "ShardDataset": "shardflow.reader",
    "Loader": "shardflow.reader",
    "sample_rng": "shardflow.task.seeds",
    "sample_seed": "shardflow.task.seeds",
    "device_rng": "shardflow.task.seeds",
    "worker_device": "shardflow.task.devices",
    "Decoder": "shardflow.codecs",
    "Encoder": "shardflow.codecs",
    "register_codec": "shardflow.codecs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once: later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))  # the lazy names too (completion in a notebook)


__all__ = [
    # errors
    "ShardflowError", "FormatError", "SampleError", "DecodeError", "EncodeError", "ShardIOError", "PipeError",
    "JobError", "SkipSample", "ShardflowWarning", "SpecError",
    # shards in a script
    "read_samples", "iter_samples", "TarWriter", "ShardWriter", "RecordWriter", "ShardInfo", "load_spec",
    "expand", "open_read", "open_write", "split_name",
    "__version__", *_LAZY,
]
