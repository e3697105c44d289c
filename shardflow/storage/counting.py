"""CountingReader: how many bytes a consumer pulled through a stream (a shard's size as stored,
compressed or not), for the stats of jobs and of `shardflow stats`."""

from __future__ import annotations

import io
from typing import Any


class CountingReader:
    """Wraps a readable stream; `nbytes` is what has been read through it so far.

    Over a local file it keeps the file's one fast path: `local_file` tells the tar block reader it
    may step back over its buffer (`seek(-n, SEEK_CUR)`, counted back) and read a large member with
    one read(n), one copy instead of chunks joined (measured: the join cost as much as the read).
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.nbytes = 0
        self.local_file = isinstance(stream, io.BufferedReader) and _seekable(stream)

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.nbytes += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_CUR) -> int:
        """Step back (or forward) from the current position; only relative seeks of a local file."""
        if whence != io.SEEK_CUR or not self.local_file:
            raise io.UnsupportedOperation("CountingReader seeks only relative to the current position of a file")
        position = self._stream.seek(offset, io.SEEK_CUR)
        self.nbytes += offset
        return position

    def tell(self) -> int:
        return self._stream.tell()

    def fileno(self) -> int:
        """The local file's descriptor (the block reader bounds a read by the file's size)."""
        if not self.local_file:
            raise io.UnsupportedOperation("not a local file")
        return self._stream.fileno()


def _seekable(stream: io.BufferedReader) -> bool:
    try:
        return stream.seekable()
    except (OSError, ValueError):
        return False
