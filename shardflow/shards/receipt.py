"""ShardInfo: the receipt of a committed shard (tar or record stream), apart from the writers so
that every kind of shard writer can return one without importing the others."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ShardInfo:
    """Receipt of a committed shard."""

    url: str
    nsamples: int
    nbytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
