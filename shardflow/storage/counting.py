"""CountingReader: how many bytes a consumer pulled through a stream (a shard's size as stored,
compressed or not), for the stats of jobs and of `shardflow stats`."""

from __future__ import annotations

from typing import Any


class CountingReader:
    """Wraps a readable stream; `nbytes` is what has been read through it so far."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.nbytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.nbytes += len(data)
        return data
