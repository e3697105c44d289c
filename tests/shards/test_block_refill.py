"""The tar block reader's refill (issue 16, small samples): each 1 MiB chunk read from the stream
becomes the buffer as it is, and only the bytes a member needs are joined, so a shard's bytes are
copied once less than when every refill joined the rest of the buffer with the whole new chunk.

Members must still come out exact, at exact offsets, whatever sizes straddle the chunk boundaries and
however short the stream's reads are (sockets, pipes, gzip).

Also: the modules the processes backend's fork server preloads for every worker exist.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc

import numpy as np

from shardflow.shards.tar_read import iter_members


def _tar(sizes: list[int]) -> tuple[bytes, list[tuple[str, bytes, int]]]:
    """A tar (Python's tarfile) and its members as (name, data, header offset)."""
    rng = np.random.default_rng(3)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"s{i:05d}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(rng.bytes(size)))
    data = out.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [(m.name, tar.extractfile(m).read(), m.offset) for m in tar]
    return data, members


class _ShortReads(io.RawIOBase):
    """A stream that returns at most a few KB per read (like a socket or a pipe)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos, self._step = data, 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        self._step = self._step % 7 + 1
        n = min(n if n >= 0 else len(self._data), self._step * 1500)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


_SIZES = [60_000, 0, 1, 511, 512, 513, (1 << 20) - 512, 1 << 20, (1 << 20) + 1, 3 << 20, 77_777] * 3


def test_members_across_chunk_boundaries_are_exact_in_every_stream_kind():
    data, expected = _tar(_SIZES)
    for stream in (io.BytesIO(data), _ShortReads(data), io.BytesIO(gzip.compress(data, 1))):
        got = [(m.name, m.data, m.offset) for m in iter_members(stream, "mem://t.tar")]
        assert got == expected


def test_a_refill_does_not_copy_the_whole_chunk_again():
    """Reading 60 KB members needs at most the old and the new 1 MiB chunk and a member; joining the
    rest of the buffer with each new chunk (the code before) made a third ~1 MiB copy per refill."""
    data, expected = _tar([60_000] * 60)  # ~3.6 MB: three refills at least
    stream = io.BytesIO(data)
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_members(stream, "mem://t.tar"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == len(expected)
    assert peak < (2 << 20) + 768 * 1024, peak  # measured: 2.2 MB now, 3.3 MB with the join


def test_fork_server_preloads_name_real_modules():
    """The fork server skips a preload name that does not import, silently: a renamed module would
    quietly move its import back into every worker of every job."""
    import importlib

    from shardflow.backends.forkserver import PRELOAD, WORKER_NEEDS

    for name in WORKER_NEEDS + tuple(n for n in PRELOAD if n.startswith("shardflow")):
        importlib.import_module(name)
