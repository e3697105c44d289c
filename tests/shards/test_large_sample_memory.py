"""Memory of large samples passed through (issue 28 item 6): a shard of 10 MB samples copied by a job
peaked at +63 MB over its imports. The reader must hold the sample it is checking (its next header
tells whether the one before is sound) while it reads the next one's first member: two samples. The
rest came from copies and references that outlived their use:

- the shard writer's hash and write threads kept a large sample in flight after write() returned, and
  each thread kept the last batch it handled until the next one came: with the reader's two, three;
- run_task's loop held the sample it had written while the reader built the next one;
- a large member read from a stream that cannot step back (compressed, remote, a pipe) was joined
  from pieces: twice the member for a moment.

Bounds are tracemalloc peaks of Python allocations (no timing): a few 8 MiB samples through
read_samples -> ShardWriter, a job, and a pipe stay under 2.75 samples; the code before this change
took 3 samples and more. Bytes must come out identical, receipts must hash them.
"""

from __future__ import annotations

import gzip
import hashlib
import tracemalloc
from pathlib import Path
from typing import Callable

import pytest

import shardflow as sf
from shardflow.errors import FormatError
from shardflow.shards.samples import read_samples
from tests.support.jobs import sha256_file

_SAMPLE = 8 << 20
# the reader's two samples and 1 MiB buffers (measured: 19.1 MiB through ShardWriter, 18.2 through a pipe);
# the code before: 35.1 and 25.1
_BOUND = 2 * _SAMPLE + 3 * _SAMPLE // 4


def _payload(i: int, size: int = _SAMPLE) -> bytes:
    return bytes([0x30 + i]) * (size - 1) + b"\n"  # no 'u' at a block's byte 257: never looks like a header


def _shard(path: Path, count: int = 5, size: int = _SAMPLE) -> list[bytes]:
    payloads = [_payload(i, size) for i in range(count)]
    with sf.TarWriter(str(path)) as writer:
        for i, data in enumerate(payloads):
            writer.write({"__key__": f"s{i:03d}", "bin": data, "cls": b"%d" % i})
    return payloads


def _peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _identity(sample):
    return sample


def test_read_samples_to_shard_writer_holds_two_samples_and_copies_byte_for_byte(tmp_path):
    src = tmp_path / "in.tar"
    _shard(src)
    receipts: list[sf.ShardInfo] = []

    def copy() -> None:
        with sf.ShardWriter(str(tmp_path / "out-%03d.tar")) as writer:
            for sample in read_samples(str(src)):
                writer.write(sample)
                del sample  # as run_task does: only the reader's two samples remain
        receipts.extend(writer.shards)

    peak = _peak(copy)
    assert peak < _BOUND, f"peak {peak / 2**20:.1f} MiB of Python allocations for {_SAMPLE >> 20} MiB samples"
    out = tmp_path / "out-000.tar"
    assert out.read_bytes() == src.read_bytes()  # TarWriter wrote the input: the copy is byte-identical
    assert [r.sha256 for r in receipts] == [sha256_file(out)]


def test_job_passthrough_holds_two_samples(tmp_path):
    src = tmp_path / "in.tar"
    _shard(src)
    small = tmp_path / "small.tar"
    _shard(small, count=1, size=1000)
    job = sf.ShardJob(_identity, inputs=str(small), outputs=str(tmp_path / "warm" / "{name}.tar"))
    assert job.run("serial", progress=False).ok  # the job's modules imported before the measurement

    reports: list[sf.RunReport] = []

    def run() -> None:
        job = sf.ShardJob(_identity, inputs=str(src), outputs=str(tmp_path / "out" / "{name}.tar"))
        reports.append(job.run("serial", progress=False))

    peak = _peak(run)
    assert reports[0].ok
    assert peak < _BOUND, f"peak {peak / 2**20:.1f} MiB of Python allocations for {_SAMPLE >> 20} MiB samples"
    assert (tmp_path / "out" / "in.tar").read_bytes() == src.read_bytes()


def test_large_members_through_a_pipe_are_read_into_one_buffer(tmp_path):
    """A pipe cannot step back over the reader's buffer: the member used to be joined from the buffer's
    rest and the stream's pieces (twice its size for a moment)."""
    src = tmp_path / "in.tar"
    payloads = _shard(src)
    got: list[bytes] = []

    def read() -> None:
        for sample in read_samples(f"pipe:cat {src}", allow_pipe=True):
            got.append(hashlib.sha256(sample["bin"]).digest())
            del sample

    peak = _peak(read)
    assert got == [hashlib.sha256(p).digest() for p in payloads]
    assert peak < _BOUND, f"peak {peak / 2**20:.1f} MiB of Python allocations for {_SAMPLE >> 20} MiB samples"


@pytest.mark.parametrize("size", [(4 << 20) - 1, 4 << 20, (5 << 20) + 7, (16 << 20) + 1])
def test_large_members_of_a_gzipped_shard_are_exact(tmp_path, size):
    """Sizes around the one-buffer read's bounds (4 MiB; 16 MiB, above which pieces are joined)."""
    src = tmp_path / "in.tar"
    payloads = _shard(src, count=2, size=size)
    packed = tmp_path / "in.tar.gz"
    packed.write_bytes(gzip.compress(src.read_bytes(), 1))
    assert [s["bin"] for s in read_samples(str(packed))] == payloads


def test_a_stream_that_ends_inside_a_large_member_is_reported_as_truncated(tmp_path):
    src = tmp_path / "in.tar"
    _shard(src, count=2, size=6 << 20)
    cut = tmp_path / "cut.tar.gz"
    whole = src.read_bytes()
    end = len(whole) - (3 << 20)  # inside the second sample's 6 MiB member
    cut.write_bytes(gzip.compress(whole[:end], 1))
    samples = read_samples(str(cut), on_error="skip")
    assert next(samples)["bin"] == _payload(0, 6 << 20)  # the whole sample before the cut
    with pytest.raises(FormatError, match=r"s001\.bin.* needs 6291456 bytes, got") as caught:
        next(samples)
    assert caught.value.key == "s001"
