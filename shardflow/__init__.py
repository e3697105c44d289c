"""shardflow: resumable, atomic, shard-parallel transforms of WebDataset tar shards.

Public names are re-exported here; heavy or optional parts (the job layer, the torch reader) load on
first use so that `import shardflow` stays fast on a worker that only re-shards.
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
    ShardIOError,
    SkipSample,
)
from shardflow.shards.keys import split_name
from shardflow.shards.samples import iter_samples, read_samples
from shardflow.shards.tar_read import iter_members
from shardflow.shards.writer import ShardInfo, ShardWriter, TarWriter
from shardflow.storage.schemes import open_read, open_write
from shardflow.storage.specs import expand

__version__ = "0.1.0"

_LAZY = {
    "Decoder": "shardflow.codecs",
    "Encoder": "shardflow.codecs",
    "register_codec": "shardflow.codecs",
    "ShardJob": "shardflow.job.shard_job",
    "ShellJob": "shardflow.job.shell",
    "sample_rng": "shardflow.task.seeds",
    "sample_seed": "shardflow.task.seeds",
    "device_rng": "shardflow.task.seeds",
    "worker_device": "shardflow.task.devices",
    "Task": "shardflow.rundir.tasks",
    "run_task": "shardflow.task.run_task",
    "RunDir": "shardflow.rundir.run_dir",
    "RunReport": "shardflow.rundir.report",
    "ShardDataset": "shardflow.reader",
    "Loader": "shardflow.reader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DecodeError", "EncodeError", "FormatError", "JobError", "PipeError", "SampleError",
    "ShardflowError", "ShardIOError", "SkipSample", "ShardInfo", "ShardWriter", "TarWriter",
    "expand", "open_read", "open_write", "iter_members", "iter_samples", "read_samples",
    "split_name", "__version__", *_LAZY,
]
