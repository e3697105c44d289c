"""shardflow: resumable, atomic, shard-parallel transforms of WebDataset tar shards.

Public names are re-exported here; heavy or optional parts (the job layer, the torch reader) load on
first use so that `import shardflow` stays fast on a worker that only re-shards.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
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
from .samples import iter_samples, read_samples, split_name
from .tario import iter_members
from .urls import expand, open_read, open_write
from .writer import ShardInfo, ShardWriter, TarWriter

__version__ = "0.1.0"

_LAZY = {
    "Decoder": "shardflow.codecs",
    "Encoder": "shardflow.codecs",
    "register_codec": "shardflow.codecs",
    "ShardJob": "shardflow.job",
    "sample_rng": "shardflow.task",
    "sample_seed": "shardflow.task",
    "Task": "shardflow.task",
    "run_task": "shardflow.task",
    "RunDir": "shardflow.rundir",
    "RunReport": "shardflow.report",
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
