"""Record-stream shards (.cbors, .mps/.msgpacks): round trips, rollover, truncation, webdataset's reader,
jobs and the CLI reading them."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import cbor2
import msgpack
import pytest

import shardflow as sf
from shardflow.errors import FormatError, SampleError
from shardflow.shards.record_write import RecordWriter
from shardflow.shards.records import iter_records, read_records, record_format
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter


def _samples(n: int) -> list[dict]:
    return [{"__key__": f"s{i:05d}", "txt": f"caption {i}".encode(), "cls": str(i % 7).encode()} for i in range(n)]


def _strip(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__url__"}


@pytest.mark.parametrize("suffix", [".cbors", ".mps", ".msgpacks"])
def test_round_trip_is_byte_exact(tmp_path, suffix):
    first = tmp_path / f"a{suffix}"
    with RecordWriter(str(first)) as w:
        for s in _samples(50):
            w.write(s)
    got = list(read_samples(str(first)))
    assert [_strip(s) for s in got] == _samples(50)
    assert all(s["__url__"] == str(first) for s in got)
    second = tmp_path / f"b{suffix}"
    with RecordWriter(str(second)) as w:
        for s in got:
            w.write(s)
    assert first.read_bytes() == second.read_bytes()


def test_tar_to_cbors_and_back_is_byte_exact(tmp_path):
    tar = tmp_path / "a.tar"
    with TarWriter(str(tar)) as w:
        for s in _samples(20):
            w.write(s)
    with ShardWriter(str(tmp_path / "c-%03d.cbors")) as w:
        for s in read_samples(str(tar)):
            w.write(s)
    with TarWriter(str(tmp_path / "back.tar")) as w:
        for s in read_samples(str(tmp_path / "c-000.cbors")):
            w.write(s)
    assert (tmp_path / "back.tar").read_bytes() == tar.read_bytes()


def test_tar_writer_refuses_a_record_name(tmp_path):
    with pytest.raises(ValueError, match="RecordWriter"):
        TarWriter(str(tmp_path / "a.cbors"))
    assert not list(tmp_path.iterdir())


def test_items_are_plain_cbor_and_msgpack_maps(tmp_path):
    with RecordWriter(str(tmp_path / "a.cbors")) as w:
        w.write({"__key__": "k1", "txt": b"x", "cls": 3})
    with RecordWriter(str(tmp_path / "a.mps")) as w:
        w.write({"__key__": "k1", "txt": b"x", "cls": 3})
    assert cbor2.loads((tmp_path / "a.cbors").read_bytes()) == {"__key__": "k1", "cls": 3, "txt": b"x"}
    assert msgpack.unpackb((tmp_path / "a.mps").read_bytes()) == {"__key__": "k1", "cls": 3, "txt": b"x"}


def test_shard_writer_rolls_over_records(tmp_path):
    with ShardWriter(str(tmp_path / "r-%03d.mps"), maxcount=7) as w:
        for s in _samples(20):
            w.write(s)
    infos = w.shards
    assert [i.nsamples for i in infos] == [7, 7, 6]
    assert [i.nbytes for i in infos] == [(tmp_path / f"r-{i:03d}.mps").stat().st_size for i in range(3)]
    keys = [s["__key__"] for i in range(3) for s in read_samples(str(tmp_path / f"r-{i:03d}.mps"))]
    assert keys == [s["__key__"] for s in _samples(20)]
    with ShardWriter(str(tmp_path / "m-%03d.cbors"), maxsize=2000) as w:
        for s in _samples(100):
            w.write(s)
    assert len(w.shards) > 1 and all(i.nbytes <= 2000 for i in w.shards)
    assert not list(tmp_path.glob(".*"))  # no temps left


@pytest.mark.parametrize("suffix", [".cbors", ".mps"])
def test_truncated_stream_names_offset_and_item(tmp_path, suffix):
    path = tmp_path / f"a{suffix}"
    with RecordWriter(str(path)) as w:
        for s in _samples(10):
            w.write(s)
    data = path.read_bytes()
    whole = list(iter_records(io.BytesIO(data), str(path)))
    cut = data[:-5]
    got = []
    with pytest.raises(FormatError) as info:
        for s in iter_records(io.BytesIO(cut), str(path), on_error="skip"):
            got.append(s)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in whole[:9]]
    last_len = len(data) - len(b"".join(_encoded(whole[:9], suffix)))
    assert info.value.offset == len(data) - last_len
    assert "item 9" in str(info.value) and str(path) in str(info.value)


def _encoded(samples, suffix):
    from shardflow.shards.records import encode_record

    return [encode_record(s, record_format("x" + suffix)) for s in samples]


def test_bad_items_follow_the_policy(tmp_path):
    data = cbor2.dumps({"__key__": "a", "txt": b"1"}) + cbor2.dumps(5) + cbor2.dumps({"__key__": "b", "txt": b"2"})
    with pytest.raises(SampleError, match="item 1 is a int"):
        list(iter_records(io.BytesIO(data), "x.cbors"))
    reported = []
    got = list(iter_records(io.BytesIO(data), "x.cbors", on_error="skip", report=reported.append))
    assert [s["__key__"] for s in got] == ["a", "b"] and len(reported) == 1
    garbage = cbor2.dumps({"__key__": "a"}) + b"\xff\xff\xff"
    with pytest.raises(FormatError, match="corrupt CBOR item 1"):
        list(iter_records(io.BytesIO(garbage), "x.cbors", on_error="skip"))


def test_arrays_map_to_fields():
    data = msgpack.packb(["k0", b"hello", 3]) + msgpack.packb(["k1", b"world", 4])
    with pytest.raises(SampleError, match="fields="):
        list(iter_records(io.BytesIO(data), "x.mps"))
    got = list(read_records(io.BytesIO(data), "x.mps", fields=("__key__", "txt", "cls")))
    assert [_strip(s) for s in got] == [{"__key__": "k0", "txt": b"hello", "cls": 3},
                                        {"__key__": "k1", "txt": b"world", "cls": 4}]


def test_memory_stays_bounded_on_a_lying_length(tmp_path):
    # a byte string claiming 1 TB: read in 64 KiB steps, never allocated
    data = cbor2.dumps({"__key__": "a"}) + bytes([0xBB]) + b"\x00\x00\x00\xe8\xd4\xa5\x10\x00" + b"abc"
    with pytest.raises(FormatError, match="truncated record stream: item 1"):
        list(iter_records(io.BytesIO(data), "x.cbors"))


def test_webdataset_reads_our_cbors(tmp_path):
    """webdataset 1.0.2 lists a `cborsiterators` module (cbors_to_samples) in typecheck.py but does not
    ship it; its reader is `cbor.load(stream)` in a loop over `url_opener` streams. Run exactly that,
    with webdataset's own url_opener and cbor2 (a drop-in for the unmaintained `cbor`)."""
    import importlib.util

    from webdataset.tariterators import url_opener

    path = tmp_path / "a.cbors"
    with RecordWriter(str(path)) as w:
        for s in _samples(30):
            w.write(s)
    if importlib.util.find_spec("webdataset.cborsiterators") is not None:  # a later webdataset
        from webdataset.cborsiterators import cbors2_samples as wds_samples  # type: ignore
        got = list(wds_samples([{"url": str(path)}]))
    else:
        got = []
        for source in url_opener([{"url": str(path)}]):
            stream = source["stream"]
            while stream.peek(1) if hasattr(stream, "peek") else True:
                try:
                    got.append(cbor2.load(stream))
                except cbor2.CBORDecodeEOF:
                    break
    assert got == _samples(30)


@pytest.mark.slow
def test_job_and_cli_read_and_write_records(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for shard in range(2):
        with RecordWriter(str(src / f"in-{shard}.cbors")) as w:
            for s in _samples(10):
                w.write({**s, "__key__": f"{shard}/{s['__key__']}"})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "shardflow.cli", "run", "reshard", "--inputs", str(src / "in-{0..1}.cbors"),
           "--outputs", str(out / "{name}.tar"), "--backend", "serial"]
    subprocess.run(cmd, check=True, capture_output=True)
    back = tmp_path / "back"
    cmd = [sys.executable, "-m", "shardflow.cli", "run", "reshard", "--inputs", str(out / "in-{0..1}.tar"),
           "--outputs", str(back / "{name}.mps"), "--backend", "serial"]
    subprocess.run(cmd, check=True, capture_output=True)
    for shard in range(2):
        a = [_strip(s) for s in read_samples(str(src / f"in-{shard}.cbors"))]
        b = [_strip(s) for s in read_samples(str(back / f"in-{shard}.mps"))]
        assert a == b and len(a) == 10
    summary = json.loads((back / "_shardflow" / "summary.json").read_text())
    assert [s["nsamples"] for s in summary["shards"]] == [10, 10]
    res = subprocess.run([sys.executable, "-m", "shardflow.cli", "stats", "--json", str(back / "in-{0..1}.mps")],
                         check=True, capture_output=True, text=True)
    assert json.loads(res.stdout)["samples"] == 20
    res = subprocess.run([sys.executable, "-m", "shardflow.cli", "ls", str(back / "in-0.mps")],
                         check=True, capture_output=True, text=True)
    assert "0/s00003" in res.stdout
    res = subprocess.run([sys.executable, "-m", "shardflow.cli", "cat", str(back / "in-0.mps"), "-k", "0/s00003",
                          "-e", "txt"], check=True, capture_output=True)
    assert res.stdout == b"caption 3"


def test_shard_dataset_reads_records(tmp_path):
    with RecordWriter(str(tmp_path / "a.cbors")) as w:
        for s in _samples(12):
            w.write(s)
    ds = sf.ShardDataset(str(tmp_path / "a.cbors"), decode=None)
    assert [s["__key__"] for s in ds] == [s["__key__"] for s in _samples(12)]
