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
    "ShardJob": "shardflow.run.job",
    "ShellJob": "shardflow.run.shell",
    "sample_rng": "shardflow.run.seeds",
    "sample_seed": "shardflow.run.seeds",
    "device_rng": "shardflow.run.seeds",
    "worker_device": "shardflow.run.devices",
    "Task": "shardflow.run.task",
    "run_task": "shardflow.run.run_task",
    "RunDir": "shardflow.run.rundir",
    "RunReport": "shardflow.run.report",
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
