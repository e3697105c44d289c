"""Layer 3 — reading shards for training: `ShardDataset` (a torch IterableDataset) and `Loader`.

`ShardDataset`, `Loader` and `collate` need torch (the `torch` extra); they are imported on first use,
so that what needs no torch works on the core install: `shardflow index` (reader.index, reader.manifest)
ran into `import torch` here and stopped with a traceback where torch was not installed (and paid ~2 s
for it where it was). The job layer never imports this package.
Module map: docs/architecture.md ("Reading for training").
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ShardDataset": "dataset", "Loader": "loader", "collate": "collate", "PackedJpegs": "values",
         "STATE_VERSION": "state"}

__all__ = ["ShardDataset", "Loader", "PackedJpegs", "collate", "STATE_VERSION"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"shardflow.reader.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardflow.reader' has no attribute {name!r}")
