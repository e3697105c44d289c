"""The fast paths of local I/O keep exact bytes and exact counts (issue 16's speed work).

- A large member of a local shard is read with one read(n) after stepping back over the block
  reader's buffer, also through the CountingReader that run_task wraps around every input: the job's
  bytes_in must still equal the file size (the step back is counted back).
- Local outputs are written with writev() in batches of at most 1,024 pieces: a batch of more
  pieces, mixed sizes, must land byte for byte in order.
- A shard that will be fsynced has its writeback started while it is written (start_writeback), over
  every byte in order; where the system refuses, the shard is still whole.
"""

from __future__ import annotations

import io
import os

import numpy as np

import shardflow as sf
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_blocks import open_blocks
from shardflow.storage.counting import CountingReader
from shardflow.storage.publish import LocalReplace


def _identity(sample):
    return sample


def _shard(path: str, sizes: list[int]) -> list[bytes]:
    rng = np.random.default_rng(1)
    payloads = [rng.bytes(size) for size in sizes]
    with sf.TarWriter(path) as writer:
        for i, data in enumerate(payloads):
            writer.write({"__key__": f"s{i:03d}", "bin": data, "cls": b"%d" % i})
    return payloads


def test_counting_reader_keeps_the_direct_read_path_and_counts_exactly(tmp_path):
    path = str(tmp_path / "in.tar")
    payloads = _shard(path, [5 << 20, 3000, 6 << 20, 100])
    with open(path, "rb") as raw:
        assert open_blocks(CountingReader(raw), path).seekable_file is not None  # one read(n) per big member
    with open(path, "rb") as raw:
        counted = CountingReader(raw)
        samples = list(read_samples(counted, path))
        assert counted.nbytes == os.path.getsize(path)
    assert [s["bin"] for s in samples] == payloads


def test_job_bytes_in_equals_file_size_with_large_members(tmp_path):
    path = str(tmp_path / "in.tar")
    payloads = _shard(path, [5 << 20, 1, 9 << 20])
    out = tmp_path / "out"
    report = sf.ShardJob(_identity, inputs=path, outputs=str(out / "{name}.tar")).run("serial", progress=False)
    assert report.ok
    assert report.stats.bytes_in == os.path.getsize(path)
    assert [s["bin"] for s in read_samples(str(out / "in.tar"))] == payloads


def test_counting_reader_refuses_seeks_it_cannot_count():
    counted = CountingReader(io.BytesIO(b"abc"))
    assert not counted.local_file
    try:
        counted.seek(-1)
    except io.UnsupportedOperation:
        pass
    else:
        raise AssertionError("a seek on a non-file stream must be refused")


def test_local_output_writev_batches_land_in_order(tmp_path):
    rng = np.random.default_rng(2)
    parts = [rng.bytes(int(n)) for n in rng.integers(0, 3000, size=2500)]  # > 1,024 pieces per batch
    target = tmp_path / "o.bin"
    out = LocalReplace(str(target), fsync=False)
    out.write(b"head")  # buffered write() before write_parts() keeps its place
    out.write_parts(parts)
    out.write_parts([b"tail"])
    out.commit()
    assert target.read_bytes() == b"head" + b"".join(parts) + b"tail"


def test_fsynced_output_starts_its_writeback_as_it_is_written(tmp_path, monkeypatch):
    """Every byte of a shard that will be fsynced has its writeback started in steps while it is written
    (so the fsync on commit waits for little); fsync=False leaves writeback to the kernel."""
    from shardflow.storage import publish

    calls: list[tuple[int, int]] = []

    def record(fd: int, offset: int, length: int) -> bool:
        calls.append((offset, length))
        return True

    monkeypatch.setattr(publish, "start_writeback", record)
    piece = bytes(range(256)) * 4096  # 1 MiB
    for fsync in (True, False):
        calls.clear()
        out = LocalReplace(str(tmp_path / f"o{fsync}.tar"), fsync=fsync)
        out.write(b"head")  # a buffered write first: the ranges must still follow the file's position
        for _ in range(20):
            out.write_parts([piece])
        out.commit()
        assert os.path.getsize(tmp_path / f"o{fsync}.tar") == 4 + 20 * len(piece)
        if not fsync:
            assert calls == []
            continue
        ranges = calls
        assert ranges[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:]))
        assert sum(n for _, n in ranges) >= 4 + 16 * len(piece)  # all but the last step's bytes
        assert all(n >= publish._WRITEBACK_STEP for _, n in ranges)


def test_writeback_hint_is_harmless_where_it_is_refused(tmp_path, monkeypatch):
    """A system without sync_file_range (or one that refuses it) stops the hints; the shard is whole."""
    from shardflow.storage import publish
    from shardflow.storage.local_files import start_writeback

    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 10)
        start_writeback(f.fileno(), 0, 10)  # True on Linux, False elsewhere: never raises
        assert start_writeback(f.fileno(), 0, 0) is False
    calls = []
    monkeypatch.setattr(publish, "start_writeback", lambda *args: calls.append(args) or False)
    out = LocalReplace(str(tmp_path / "o.tar"))
    piece = b"\1" * (9 << 20)
    out.write_parts([piece])
    out.write_parts([piece])
    out.commit()
    assert len(calls) == 1  # refused once: no more tries for this file
    assert (tmp_path / "o.tar").read_bytes() == piece + piece


def test_small_members_reach_the_sink_as_few_pieces_and_large_ones_uncopied():
    """The sink's hashing thread takes the GIL back after each piece: 60 KB members arrive joined (a
    few pieces per ~1 MiB batch); members of 256 KiB and up are passed on as the very same objects."""
    from shardflow.shards.tar_write import TarStreamWriter

    batches: list[list[bytes]] = []

    class Sink:
        def write_parts(self, parts: list[bytes]) -> None:
            batches.append(parts)

    rng = np.random.default_rng(3)
    small = [rng.bytes(60_000) for _ in range(40)]
    large = [rng.bytes(300_000), rng.bytes(5 << 20)]
    writer = TarStreamWriter(Sink())  # type: ignore[arg-type]
    for i, data in enumerate(small + large):
        writer.add(f"s{i:03d}.bin", data)
    writer.finish()
    pieces = [p for batch in batches for p in batch]
    assert [len(batch) for batch in batches[:2]] == [1, 1]  # ~1 MiB of 60 KB members: one piece each
    assert sum(any(p is data for p in pieces) for data in large) == len(large)
    assert not any(p is data for p in pieces for data in small)
    expected = io.BytesIO()
    plain = TarStreamWriter(expected)
    for i, data in enumerate(small + large):
        plain.add(f"s{i:03d}.bin", data)
    plain.finish()
    assert b"".join(pieces) == expected.getvalue()


def test_writes_are_cut_into_system_calls_of_at_most_1_mib(tmp_path):
    """Large members go to the file in 1 MiB slices (the kernel sizes page-cache folios by the write),
    small pieces are grouped up to 1 MiB and 1,024 pieces per writev; every byte lands in order."""
    from shardflow.storage import publish

    rng = np.random.default_rng(4)
    sizes = [0, 1, 5000, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 << 20, 7, 10_000_000, 12] + [100] * 2000
    parts = [rng.bytes(n) for n in sizes]
    groups = publish._write_groups(parts)
    assert b"".join(b"".join(bytes(p) for p in g) for g in groups) == b"".join(parts)
    assert all(sum(map(len, g)) <= publish._MAX_WRITE and len(g) <= publish._IOV_MAX for g in groups)
    assert sum(map(len, groups[0])) == publish._MAX_WRITE  # filled up, not cut at piece boundaries
    target = tmp_path / "o.bin"
    out = LocalReplace(str(target))
    out.write_parts(parts)
    out.commit()
    assert target.read_bytes() == b"".join(parts)
