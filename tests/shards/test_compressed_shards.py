"""Compressed tar shards written and read (.tar.gz/.tgz, .tar.bz2/.tbz2, .tar.xz/.txz, .tar.zst/.tzst):
what the name says is what is stored (checked by the real xz/bzip2/zstd/gzip and GNU tar), reruns are
byte-identical, the receipt hashes the stored bytes, shardflow reads them back (and GNU tar's own
--zstd archives), names it cannot write are refused before anything exists, and damage is one line."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.errors import FormatError
from shardflow.shards.formats import UnwritableName, output_compression, shard_stem, sniff
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter

pytest.importorskip("zstandard", reason="the zstd extra (pip install 'shardflow[zstd]') is part of the test install")

# suffix -> (the tool that tests the stored stream, what `file`-like sniffing must say)
FORMATS = {
    ".tar.gz": ("gzip", "gzip"), ".tgz": ("gzip", "gzip"),
    ".tar.bz2": ("bzip2", "bzip2"), ".tbz2": ("bzip2", "bzip2"),
    ".tar.xz": ("xz", "xz"), ".txz": ("xz", "xz"),
    ".tar.zst": ("zstd", "zstd"), ".tzst": ("zstd", "zstd"),
}


def samples(n: int = 30) -> list[dict]:
    return [{"__key__": f"k{i:04d}", "txt": b"sample %d " % i * (3 + i), "bin": bytes(range(256)) * (i % 5)}
            for i in range(n)]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")
    return path


def check_with_tools(path, compression: str, expected: list[dict]) -> None:
    """The stored file is the compression its name says (the tool's own -t) and a tar GNU tar lists."""
    subprocess.run([tool(compression), "-t", "-q", str(path)], check=True)
    listing = subprocess.run([tool("tar"), "-tf", str(path)], check=True, capture_output=True, text=True).stdout
    names = [f"{s['__key__']}.{ext}" for s in expected for ext in sorted(k for k in s if k != "__key__")]
    assert listing.split() == names


def plain(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__url__"}


@pytest.mark.parametrize("suffix", list(FORMATS))
def test_tar_writer_stores_what_the_name_says(suffix, tmp_path):
    compression = FORMATS[suffix][0]
    expected = samples()
    runs = []
    for run in ("a", "b"):
        path = tmp_path / run / f"shard{suffix}"
        path.parent.mkdir()
        writer = TarWriter(str(path))
        for sample in expected:
            writer.write(sample)
        info = writer.close()
        data = path.read_bytes()
        assert sniff(data[:8]) == FORMATS[suffix][1]
        assert info.sha256 == hashlib.sha256(data).hexdigest()  # the receipt covers the bytes stored
        assert info.nsamples == len(expected)
        check_with_tools(path, compression, expected)
        assert [plain(s) for s in read_samples(str(path))] == expected
        runs.append(data)
    assert runs[0] == runs[1]  # deterministic: byte-identical reruns


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.bz2", ".tar.zst"])
def test_shard_writer_rolls_over_into_compressed_shards(suffix, tmp_path):
    expected = samples(40)
    outputs = []
    for run in ("a", "b"):
        with ShardWriter(str(tmp_path / run / f"part-{{shard:03d}}{suffix}"), maxcount=15) as writer:
            for sample in expected:
                writer.write(sample)
        files = sorted((tmp_path / run).iterdir())
        assert [p.name for p in files] == [f"part-{i:03d}{suffix}" for i in range(3)]
        assert [info.sha256 for info in writer.shards] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
        for index, path in enumerate(files):
            check_with_tools(path, FORMATS[suffix][0], expected[15 * index : 15 * index + 15])
        assert [plain(s) for p in files for s in read_samples(str(p))] == expected
        outputs.append([p.read_bytes() for p in files])
    assert outputs[0] == outputs[1]


def test_a_tar_zst_made_by_gnu_tar_is_read(tmp_path):
    tar = tool("tar")
    tool("zstd")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"k{i}.txt").write_bytes(b"x%d" % i * 1000)
        (src / f"k{i}.json").write_bytes(b'{"i": %d}' % i)
    out = tmp_path / "gnu.tar.zst"
    subprocess.run([tar, "--zstd", "-cf", str(out), "-C", str(src), *sorted(p.name for p in src.iterdir())],
                   check=True)
    got = list(read_samples(str(out)))
    assert [s["__key__"] for s in got] == [f"k{i}" for i in range(5)]
    assert got[3]["txt"] == b"x3" * 1000 and got[3]["json"] == b'{"i": 3}'


@pytest.mark.parametrize("name", ["a.tar.lz4", "a.tar.Z", "a.tar.lzma", "a.tar.zstd", "a.tlz", "a.lz4"])
def test_names_it_cannot_write_are_refused_before_anything_exists(name, tmp_path):
    target = tmp_path / name
    with pytest.raises(UnwritableName, match=r"cannot write '\.[^']+' shards \(it writes \.tar, \.tar\.gz"):
        TarWriter(str(target))
    with pytest.raises(UnwritableName) as info:
        ShardWriter(str(tmp_path / ("p-{shard:03d}-" + name)))
    assert "\n" not in str(info.value) and repr(str(tmp_path / ("p-000-" + name))) in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no shard, no temp


@pytest.mark.parametrize("name,compression", [("a.tar", ""), ("a.tar.001", ""), ("x.gz", "gzip"),
                                              ("A.TAR.XZ", "xz"), ("s3://b/x.tar.zst?versionId=3", "zstd"),
                                              ("a.cbors", "")])
def test_names_it_writes(name, compression):
    assert output_compression(name) == compression


def test_stems_drop_every_shard_suffix():
    for suffix in [*FORMATS, ".tar", ".tbz", ".cbors", ".mps", ".msgpacks"]:
        assert shard_stem(f"s3://b/d/train-000007{suffix}") == "train-000007"


_NO_ZSTD = """
import sys
sys.modules["zstandard"] = None  # this interpreter has no zstandard: import fails
from shardflow.errors import ShardflowError
from shardflow.shards.formats import UnwritableName
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
try:
    TarWriter(sys.argv[1] + "/new.tar.zst")
except UnwritableName as exc:
    print("WRITE", exc)
try:
    list(read_samples(sys.argv[1] + "/in.tar.zst"))
except ShardflowError as exc:
    print("READ", exc)
"""


def test_without_zstandard_zstd_is_refused_in_one_line_naming_the_extra(tmp_path):
    with TarWriter(str(tmp_path / "in.tar.zst")) as writer:
        writer.write(samples(1)[0])
    out = subprocess.run([sys.executable, "-c", _NO_ZSTD, str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(out) == 2, out
    assert out[0].startswith(f"WRITE output '{tmp_path}/new.tar.zst' is zstd-compressed") \
        and "pip install 'shardflow[zstd]'" in out[0]
    assert out[1].startswith(f"READ shard {tmp_path}/in.tar.zst") and "pip install 'shardflow[zstd]'" in out[1]
    assert not (tmp_path / "new.tar.zst").exists()


def _compressed(suffix: str, n: int = 40) -> tuple[bytes, list[dict]]:
    stream = io.BytesIO()
    stream.name = f"x{suffix}"
    expected = samples(n)
    with TarWriter(stream) as writer:
        for sample in expected:
            writer.write(sample)
    data = stream.getvalue()
    assert (sniff(data[:8]) is None) == (suffix == ".tar")  # compressed as the name says
    return data, expected


def _read_until_error(data: bytes) -> tuple[list[dict], FormatError | None]:
    got: list[dict] = []
    try:
        for sample in read_samples(io.BytesIO(data), "file:///d/bad.tar.x", on_error="skip", report=lambda e: None):
            got.append(plain(sample))
    except FormatError as exc:
        return got, exc
    return got, None


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.zst", ".tar.bz2"])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(cut=st.floats(0.02, 0.98))
def test_any_cut_gives_whole_samples_then_one_line_naming_the_shard(suffix, cut):
    data, expected = _compressed(suffix)
    got, error = _read_until_error(data[: int(len(data) * cut)])
    assert got == expected[: len(got)]  # never a partial or changed sample
    assert error is not None and "\n" not in str(error) and str(error).startswith("shard file:///d/bad.tar.x")


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.zst"])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(at=st.floats(0.05, 0.95), bit=st.integers(0, 7))
def test_a_flipped_bit_is_always_reported_in_one_line(suffix, at, bit):
    """Both streams carry a checksum (zstd's per frame: written with one), so no flip goes unnoticed;
    as with gzip, what was decompressed before the check is handed out first (a stream's check comes
    at its end), and the error follows."""
    data, _ = _compressed(suffix)
    bad = bytearray(data)
    bad[int(len(bad) * at)] ^= 1 << bit
    _, error = _read_until_error(bytes(bad))
    assert error is not None and "\n" not in str(error) and str(error).startswith("shard file:///d/bad.tar.x")


def test_concatenated_zstd_frames_are_read_on():
    import zstandard

    data, expected = _compressed(".tar")
    cut = 20 * 1024
    frames = b"".join(zstandard.ZstdCompressor().compress(part) for part in (data[:cut], data[cut:]))
    assert [plain(s) for s in read_samples(io.BytesIO(frames), "file:///d/two.tar.zst")] == expected


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.bz2", ".tar.zst"])
def test_the_batch_path_stores_the_same_bytes_as_sample_by_sample(suffix, tmp_path):
    """The compressors' output does not depend on how the tar reaches them (batches or members)."""
    from shardflow.shards.samples import sample_members

    expected = samples(60)
    with ShardWriter(str(tmp_path / f"one-{{shard}}{suffix}")) as one:
        for sample in expected:
            one.write(sample)
    with ShardWriter(str(tmp_path / f"batch-{{shard}}{suffix}")) as batch:
        batch.write_batch([sample_members(s) for s in expected])
    stored = (tmp_path / f"one-0{suffix}").read_bytes()
    assert sniff(stored[:8]) == FORMATS[suffix][1] and stored == (tmp_path / f"batch-0{suffix}").read_bytes()
