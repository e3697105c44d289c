"""Layer 3 — reading shards for training: `ShardDataset` (a torch IterableDataset) and `Loader`.

`import shardflow.reader` needs torch (the `torch` extra); the job layer never imports this package.
Module map: docs/architecture.md ("Reading for training").
"""

from shardflow.reader.collate import collate
from shardflow.reader.dataset import ShardDataset
from shardflow.reader.loader import Loader
from shardflow.reader.state import STATE_VERSION
from shardflow.reader.values import PackedJpegs

__all__ = ["ShardDataset", "Loader", "PackedJpegs", "collate", "STATE_VERSION"]
