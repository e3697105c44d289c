"""Files a `shardflow map` command leaves are streamed into the output shard, not read into RAM (issue 26
item 9): a large file comes back as an open descriptor (storage.file_value.FileValue) that the tar
writer copies in chunks; the archive and its receipt are the bytes the in-RAM path writes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import shardflow as sf
from shardflow.job.shell_files import STREAM_FROM
from shardflow.storage.file_value import FileValue
from tests.support.jobs import sha256_file

BIG = 300_000_000  # bytes of random data the command writes
# Runs argv[1:] and prints its exit status and the peak RSS (KiB) of its largest process (the serial
# backend: the run, its tasks and its writer are one process; the command's processes are small).
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(r.stdout + r.stderr); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def one_sample_shard(path: Path) -> str:
    with sf.TarWriter(str(path)) as w:
        w.write({"__key__": "a", "txt": b"x"})
    return str(path)


def map_peak(tmp_path: Path, name: str, command: str) -> tuple[int, Path]:
    """Peak RSS (KiB) of `shardflow map -b serial` running `command` on one sample; the output shard."""
    spec = one_sample_shard(tmp_path / f"{name}.tar")
    out = tmp_path / f"out-{name}"
    result = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "shardflow.cli", "map", spec, "-o",
                             str(out / "{name}.tar"), "-b", "serial", "--no-progress", "-c", command],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    code, peak = result.stdout.split()
    assert code == "0", result.stderr
    return int(peak), out / f"{name}.tar"


def receipt(shard: Path) -> dict:
    done = json.loads((shard.parent / "_shardflow" / "done" / "000000.json").read_text())
    (output,) = done["outputs"]
    return output


def test_a_large_file_is_streamed_not_held_in_memory(tmp_path):
    base, _ = map_peak(tmp_path, "small", "head -c 1000 /dev/urandom > big.bin")
    command = f"head -c {BIG} /dev/urandom > big.bin && sha256sum big.bin > big.sum"
    peak, shard = map_peak(tmp_path, "large", command)
    assert peak - base < 150 * 1024, f"peak RSS {peak} KiB with a {BIG}-byte file, {base} KiB without"
    with tarfile.open(shard) as tar:
        member = tar.getmember("a.bin")
        assert member.size == BIG
        h = hashlib.sha256()
        data = tar.extractfile(member)
        while block := data.read(1 << 20):
            h.update(block)
        written_sum = tar.extractfile("a.sum").read().split()[0].decode()  # what the command saw
    assert h.hexdigest() == written_sum
    assert receipt(shard)["sha256"] == sha256_file(shard)
    assert receipt(shard)["nbytes"] == shard.stat().st_size


def test_a_small_file_stays_bytes_and_the_shard_is_unchanged(tmp_path):
    _, shard = map_peak(tmp_path, "small", "printf 'hello world\\n' > note.txt && rm a.txt")
    expected = tmp_path / "expected.tar"
    with sf.TarWriter(str(expected)) as w:  # the bytes the in-RAM path has always written
        w.write({"__key__": "a", "txt": b"hello world\n"})
    assert shard.read_bytes() == expected.read_bytes()
    assert receipt(shard)["sha256"] == sha256_file(expected)


def open_value(path: Path) -> FileValue:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    return FileValue(fd, os.fstat(fd).st_size, path.name)


def write_all(path: Path, samples: list[dict]) -> sf.ShardInfo:
    writer = sf.TarWriter(str(path), encoder=sf.Encoder())
    for sample in samples:
        writer.write(sample)
    return writer.close()


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_file_value_writes_the_bytes_and_receipt_of_the_same_bytes_in_ram(tmp_path, suffix):
    data = os.urandom(STREAM_FROM + 12345)  # not a multiple of the chunk or the block size
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    value = open_value(source)
    source.unlink()  # as the command's directory is removed before the writer runs: the descriptor keeps it
    samples = [{"__key__": "k0", "txt": b"before"}, {"__key__": "k1", "bin": value, "txt": b"beside"},
               {"__key__": "k2", "txt": b"after"}]
    streamed = write_all(tmp_path / f"streamed{suffix}", samples)
    samples[1]["bin"] = data
    in_ram = write_all(tmp_path / f"in_ram{suffix}", samples)
    assert (tmp_path / f"streamed{suffix}").read_bytes() == (tmp_path / f"in_ram{suffix}").read_bytes()
    assert (streamed.sha256, streamed.nbytes) == (in_ram.sha256, in_ram.nbytes)
    value.close()


def test_a_file_that_shrinks_before_it_is_written_leaves_no_shard(tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(STREAM_FROM))
    value = open_value(source)
    os.truncate(source, 1000)  # shorter than the size the tar header promises
    target = tmp_path / "out.tar"
    with pytest.raises(sf.ShardIOError, match="shrank"):
        with sf.TarWriter(str(target)) as w:
            w.write({"__key__": "k", "bin": value})
    assert not target.exists()
    value.close()
