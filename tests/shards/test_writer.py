"""TarWriter / ShardWriter: receipts, reproducibility, rollover, atomic commit (local, memory, S3)."""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
import threading
import time

import fsspec
import pytest

from shardflow.errors import PipeError, SampleError, ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_write import TarStreamWriter
from shardflow.shards.task_files import remove_stale_temps
from shardflow.shards.writer import ShardInfo, ShardWriter, TarWriter, format_shard_name


def make_samples(n: int, size=lambda i: 100 + i, prefix="s"):
    return [{"__key__": f"{prefix}/{i:06d}", "cls": b"%d" % i, "bin": os.urandom(size(i))} for i in range(n)]


def all_files(path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def read_back(url, **kw):
    return [{k: v for k, v in s.items() if k != "__url__"} for s in read_samples(url, **kw)]


def sample_bytes(sample) -> int:
    return sum(TarStreamWriter.member_size(f"{sample['__key__']}.{e}", len(v))
               for e, v in sample.items() if not e.startswith("__"))


class Boom(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# TarWriter


def test_tarwriter_receipt_matches_the_file(tmp_path):
    samples = make_samples(20)
    url = str(tmp_path / "out.tar")
    with TarWriter(url) as w:
        for s in samples:
            w.write(s)
    info = w.close() if not w.closed else None
    assert info is None  # the context manager committed it
    data = (tmp_path / "out.tar").read_bytes()
    assert read_back(url) == samples
    with tarfile.open(url) as tf:
        assert len(tf.getmembers()) == 40

    w2 = TarWriter(str(tmp_path / "again.tar"))
    for s in samples:
        w2.write(s)
    receipt = w2.close()
    assert receipt == ShardInfo(str(tmp_path / "again.tar"), 20, len(data), hashlib.sha256(data).hexdigest())
    assert (tmp_path / "again.tar").read_bytes() == data
    assert receipt.to_json()["sha256"] == hashlib.sha256(data).hexdigest()


def test_tarwriter_to_an_open_stream():
    buf = io.BytesIO()
    w = TarWriter(buf)
    w.write({"__key__": "a", "txt": b"x"})
    info = w.close()
    assert info.nbytes == len(buf.getvalue()) == 3 * 512 + 512
    assert not buf.closed  # the caller's stream stays open


def test_exception_inside_tarwriter_leaves_nothing(tmp_path):
    with pytest.raises(Boom):
        with TarWriter(str(tmp_path / "x.tar")) as w:
            w.write({"__key__": "a", "txt": b"x" * 100_000})
            assert all_files(tmp_path) and "x.tar" not in all_files(tmp_path)  # only a hidden temp
            raise Boom
    assert all_files(tmp_path) == []


def test_write_after_close_is_refused(tmp_path):
    w = TarWriter(str(tmp_path / "x.tar"))
    w.write({"__key__": "a", "txt": b"x"})
    w.close()
    with pytest.raises(ValueError):
        w.write({"__key__": "b", "txt": b"x"})
    with pytest.raises(ValueError):
        w.close()


def test_members_are_sorted_whatever_the_dict_order(tmp_path):
    a = io.BytesIO()
    b = io.BytesIO()
    with TarWriter(a) as wa:
        wa.write({"__key__": "k", "txt": b"t", "cls": b"1", "jpg": b"j"})
    with TarWriter(b) as wb:
        wb.write({"__key__": "k", "jpg": b"j", "cls": b"1", "txt": b"t"})
    assert a.getvalue() == b.getvalue()
    with tarfile.open(fileobj=io.BytesIO(a.getvalue())) as tf:
        assert tf.getnames() == ["k.cls", "k.jpg", "k.txt"]


def test_encoder_is_applied(tmp_path):
    codecs = pytest.importorskip("shardflow.codecs")
    url = str(tmp_path / "enc.tar")
    with TarWriter(url, encoder=codecs.Encoder()) as w:
        w.write({"__key__": "a", "json": {"x": [1, 2]}, "cls": 3, "txt": "héllo"})
    (s,) = read_back(url)
    assert s == {"__key__": "a", "json": b'{"x":[1,2]}', "cls": b"3", "txt": "héllo".encode()}


# ------------------------------------------------------------------------------------------------
# reproducibility


def test_same_input_same_bytes(tmp_path):
    samples = make_samples(300, size=lambda i: (i * 7919) % 5000)
    receipts = []
    for run in ("a", "b"):
        with ShardWriter(str(tmp_path / run / "x-%03d.tar"), maxcount=50, maxsize=200_000) as w:
            for s in samples:
                w.write(dict(s))
        receipts.append(w.shards)
    a, b = receipts
    assert len(a) > 3
    assert [(r.nsamples, r.nbytes, r.sha256) for r in a] == [(r.nsamples, r.nbytes, r.sha256) for r in b]
    for ra, rb in zip(a, b):
        assert open(ra.url, "rb").read() == open(rb.url, "rb").read()


# ------------------------------------------------------------------------------------------------
# rollover


def test_rollover_by_count_and_no_empty_shard(tmp_path):
    pattern = str(tmp_path / "c-{shard:04d}.tar")
    samples = make_samples(30)
    with ShardWriter(pattern, maxcount=10) as w:
        for s in samples:
            w.write(s)
    assert [i.nsamples for i in w.shards] == [10, 10, 10]
    assert all_files(tmp_path) == ["c-0000.tar", "c-0001.tar", "c-0002.tar"]  # no empty c-0003.tar
    got = [s for i in w.shards for s in read_back(i.url)]
    assert got == samples
    for info in w.shards:
        data = open(info.url, "rb").read()
        assert info.nbytes == len(data) and info.sha256 == hashlib.sha256(data).hexdigest()


def test_nothing_written_creates_no_shard(tmp_path):
    with ShardWriter(str(tmp_path / "e-%d.tar"), maxcount=5) as w:
        pass
    assert w.shards == [] and all_files(tmp_path) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollover_by_size_keeps_every_shard_under_maxsize(tmp_path, seed):
    rng = random.Random(seed)
    sizes = [rng.choice([10, 500, 3000, 20_000, 70_000]) for _ in range(200)]
    samples = make_samples(200, size=lambda i: sizes[i])
    maxsize = 150_000
    with ShardWriter(str(tmp_path / "z-%04d.tar"), maxcount=10_000, maxsize=maxsize) as w:
        for s in samples:
            w.write(s)
    shards = w.shards
    assert len(shards) > 5
    got = []
    for n, info in enumerate(shards):
        assert os.path.getsize(info.url) == info.nbytes <= maxsize
        part = read_back(info.url)
        got += part
        if n + 1 < len(shards):  # tight: the next sample really did not fit
            nxt = samples[len(got)]
            assert info.nbytes + sample_bytes(nxt) > maxsize
    assert got == samples


def test_a_single_oversize_sample_gets_a_shard_of_its_own(tmp_path):
    samples = make_samples(3, size=lambda i: 500)
    big = {"__key__": "s/big", "bin": os.urandom(50_000)}
    with ShardWriter(str(tmp_path / "o-%d.tar"), maxsize=10_000) as w:
        for s in [samples[0], big, samples[1], samples[2]]:
            w.write(s)
    counts = [(i.nsamples, i.nbytes > 10_000) for i in w.shards]
    assert counts == [(1, False), (1, True), (2, False)]
    assert read_back(w.shards[1].url) == [big]


def test_maxcount_one_and_limits_validated(tmp_path):
    with ShardWriter(str(tmp_path / "one-%d.tar"), maxcount=1) as w:
        for s in make_samples(3):
            w.write(s)
    assert [i.nsamples for i in w.shards] == [1, 1, 1]
    with pytest.raises(ValueError):
        ShardWriter(str(tmp_path / "x-%d.tar"), maxcount=0)
    with pytest.raises(ValueError):
        ShardWriter(str(tmp_path / "x-%d.tar"), maxsize=100)


def test_shard_names_and_on_commit(tmp_path):
    assert format_shard_name("a-%06d.tar", 7) == "a-000007.tar"
    assert format_shard_name("a-{shard:03d}.tar", 7) == "a-007.tar"
    assert format_shard_name("a-{:02d}.tar", 7) == "a-07.tar"
    assert format_shard_name(lambda i: f"n{i}.tar", 7) == "n7.tar"
    seen: list[ShardInfo] = []
    with ShardWriter(lambda i: str(tmp_path / f"cb{i}.tar"), maxcount=2, start_index=5, on_commit=seen.append) as w:
        for s in make_samples(5):
            w.write(s)
    assert [os.path.basename(i.url) for i in seen] == ["cb5.tar", "cb6.tar", "cb7.tar"]
    assert seen == w.shards


def test_a_bad_sample_does_not_damage_the_shard(tmp_path):
    samples = make_samples(4)
    with ShardWriter(str(tmp_path / "b-%d.tar"), maxcount=100) as w:
        w.write(samples[0])
        with pytest.raises(SampleError):
            w.write({"__key__": "bad.key", "txt": b"x"})
        with pytest.raises(SampleError):
            w.write({"__key__": "k", "json": {"not": "bytes"}})
        for s in samples[1:]:
            w.write(s)
    assert read_back(w.shards[0].url) == samples


# ------------------------------------------------------------------------------------------------
# atomic commit


def test_exception_mid_shard_keeps_committed_shards_and_leaves_no_partial(tmp_path):
    samples = make_samples(25, size=lambda i: 10_000)
    with pytest.raises(Boom):
        with ShardWriter(str(tmp_path / "a-%03d.tar"), maxcount=10) as w:
            for n, s in enumerate(samples):
                if n == 23:
                    listing = all_files(tmp_path)
                    temps = [f for f in listing if f.startswith(".") and ".tmp-" in f]
                    # in progress: hidden (the shard before may still be committing in the background)
                    assert any(t.startswith(".a-002.tar.tmp-") for t in temps) and "a-002.tar" not in listing
                    raise Boom
                w.write(s)
    assert all_files(tmp_path) == ["a-000.tar", "a-001.tar"]  # no a-002.tar, no temp file
    assert [s["__key__"] for s in read_back(str(tmp_path / "a-001.tar"))][-1] == "s/000019"


@pytest.mark.parametrize("fsync,threaded", [(False, True), (True, False), (False, False)])
def test_fsync_and_threads_can_be_turned_off(tmp_path, fsync, threaded):
    samples = make_samples(12, size=lambda i: 50_000)
    with ShardWriter(str(tmp_path / "f-%d.tar"), maxcount=5, fsync=fsync, threaded=threaded) as w:
        for s in samples:
            w.write(s)
    assert all_files(tmp_path) == ["f-0.tar", "f-1.tar", "f-2.tar"]
    assert [s for i in w.shards for s in read_back(i.url)] == samples
    with pytest.raises(Boom):
        with TarWriter(str(tmp_path / "g.tar"), fsync=fsync, threaded=threaded) as t:
            t.write(samples[0])
            raise Boom
    assert all_files(tmp_path) == ["f-0.tar", "f-1.tar", "f-2.tar"]


@pytest.mark.parametrize("background", [True, False])
def test_commit_failure_is_raised_and_cleaned_up(tmp_path, background):
    (tmp_path / "c-1.tar").mkdir()  # a directory in the way: the rename of shard 1 fails
    (tmp_path / "c-1.tar" / "keep").write_bytes(b"x")
    samples = make_samples(30, size=lambda i: 20_000)
    with pytest.raises(ShardIOError, match="commit failed") as info:
        with ShardWriter(str(tmp_path / "c-%d.tar"), maxcount=10, background_commit=background) as w:
            for s in samples:
                w.write(s)
    assert "c-1.tar" in str(info.value)
    assert [i.url for i in w.shards] == [str(tmp_path / "c-0.tar")]
    left = all_files(tmp_path)
    assert ".tmp-" not in "".join(left) and "c-0.tar" in left and "c-2.tar" not in left


def test_background_commit_delivers_receipts_in_order_in_the_callers_thread(tmp_path):
    before = set(threading.enumerate())
    seen = []
    with ShardWriter(str(tmp_path / "o-%02d.tar"), maxcount=3,
                     on_commit=lambda info: seen.append((info.url, threading.get_ident()))) as w:
        for s in make_samples(20, size=lambda i: 30_000):
            w.write(s)
    assert [u for u, _ in seen] == [str(tmp_path / f"o-{i:02d}.tar") for i in range(7)]
    assert {t for _, t in seen} == {threading.get_ident()}
    assert [i.url for i in w.shards] == [u for u, _ in seen]
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("shardflow-")]


def test_remove_stale_temps(tmp_path):
    url = str(tmp_path / "x-000.tar")
    w = TarWriter(url)  # a writer that "crashed": never closed nor aborted
    w.write({"__key__": "a", "txt": b"x"})
    w._sink.flush()
    stale = [f for f in all_files(tmp_path) if ".tmp-" in f]
    assert len(stale) == 1
    (tmp_path / "x-001.tar").write_bytes(b"other shard, not a temp")
    assert remove_stale_temps(url) == 1
    assert all_files(tmp_path) == ["x-001.tar"]
    w.abort()


def test_memory_filesystem_commit_and_abort():
    fs = fsspec.filesystem("memory")
    base = "memory://shardflow-test-writer"
    samples = make_samples(12)
    with ShardWriter(base + "/m-%02d.tar", maxcount=5) as w:
        for s in samples:
            w.write(s)
    assert sorted(fs.ls("/shardflow-test-writer", detail=False)) == [
        "/shardflow-test-writer/m-00.tar", "/shardflow-test-writer/m-01.tar", "/shardflow-test-writer/m-02.tar"]
    assert [s for i in w.shards for s in read_back(i.url)] == samples
    with pytest.raises(Boom):
        with TarWriter(base + "/gone.tar") as t:
            t.write(samples[0])
            raise Boom
    assert not fs.exists("/shardflow-test-writer/gone.tar")
    assert len(fs.ls("/shardflow-test-writer", detail=False)) == 3  # no temp left either
    fs.rm("/shardflow-test-writer", recursive=True)


def test_pipe_target_needs_permission_and_reports_failure(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDFLOW_ALLOW_PIPE", raising=False)
    out = tmp_path / "piped.tar"
    with pytest.raises(PipeError, match="off by default"):
        TarWriter(f"pipe:cat > {out}")
    assert not out.exists()
    with TarWriter(f"pipe:cat > {out}", allow_pipe=True) as w:
        w.write({"__key__": "p", "txt": b"piped"})
    assert read_back(str(out)) == [{"__key__": "p", "txt": b"piped"}]
    w = TarWriter("pipe:cat > /dev/null; exit 3", allow_pipe=True)
    w.write({"__key__": "p", "txt": b"x"})
    with pytest.raises(PipeError, match="status 3"):
        w.close()


def test_write_error_is_a_shard_io_error(tmp_path):
    w = TarWriter("pipe:exec 0<&-; sleep 0.2", allow_pipe=True)  # a command that closes its stdin
    with pytest.raises(ShardIOError) as info:
        for _ in range(200):
            w.write({"__key__": "p", "bin": b"x" * 100_000})
    assert "pipe:" in str(info.value)
    w.abort()


# ------------------------------------------------------------------------------------------------
# the background hashing/writing threads


@pytest.mark.slow
@pytest.mark.parametrize("size", [10, 3000, 40_000, 300_000, 3_000_000])
def test_threaded_and_plain_writers_give_the_same_bytes_and_receipt(tmp_path, size):
    samples = make_samples(60, size=lambda i: size + i)
    receipts = []
    for threaded in (True, False):
        url = str(tmp_path / f"t-{threaded}.tar")
        with TarWriter(url, threaded=threaded) as w:
            for s in samples:
                w.write(s)
        receipts.append((w.nsamples, os.path.getsize(url), hashlib.sha256(open(url, "rb").read()).hexdigest()))
        assert read_back(url) == samples
    assert receipts[0] == receipts[1]
    assert (tmp_path / "t-True.tar").read_bytes() == (tmp_path / "t-False.tar").read_bytes()


@pytest.mark.slow
def test_error_in_the_writing_thread_reaches_the_caller(tmp_path):
    w = TarWriter("pipe:exec 0<&-; sleep 5", allow_pipe=True)  # a reader that went away
    t0 = time.monotonic()
    with pytest.raises(ShardIOError, match="write failed"):
        for _ in range(500):
            w.write({"__key__": "p", "bin": b"x" * 100_000})
        w.close()
    assert time.monotonic() - t0 < 30
    w.abort()


def test_abort_with_batches_in_flight_leaves_nothing(tmp_path):
    before = set(threading.enumerate())
    with pytest.raises(Boom):
        with TarWriter(str(tmp_path / "x.tar")) as w:
            for i in range(50):
                w.write({"__key__": f"k{i}", "bin": os.urandom(500_000)})
            raise Boom
    assert all_files(tmp_path) == []
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("shardflow-")]


def test_a_dropped_writer_is_aborted(tmp_path):
    import gc

    w = TarWriter(str(tmp_path / "dropped.tar"))
    w.write({"__key__": "k", "bin": os.urandom(2_000_000)})
    assert len(all_files(tmp_path)) == 1  # its temp file
    del w
    gc.collect()
    assert all_files(tmp_path) == []


# ------------------------------------------------------------------------------------------------
# S3 (the real S3-compatible server from conftest)


def test_s3_round_trip(s3_server, s3_bucket):
    options = s3_server.storage_options
    samples = make_samples(25, size=lambda i: 2000 + i)
    pattern = f"{s3_bucket}/rt/shard-%06d.tar"
    with ShardWriter(pattern, maxcount=10, storage_options=options) as w:
        for s in samples:
            w.write(s)
    assert [i.url for i in w.shards] == [pattern % n for n in range(3)]
    fs = s3_server.filesystem()
    got = []
    for info in w.shards:
        blob = fs.cat_file(info.url)
        assert len(blob) == info.nbytes and hashlib.sha256(blob).hexdigest() == info.sha256
        got += read_back(info.url, storage_options=options)
    assert got == samples


def test_s3_failed_write_leaves_no_object(s3_server, s3_bucket):
    options = s3_server.storage_options
    fs = s3_server.filesystem()
    bucket = s3_bucket.split("://", 1)[1]
    url = f"{s3_bucket}/failed/big.tar"
    with pytest.raises(Boom):
        with TarWriter(url, storage_options=options) as w:
            for i in range(10):  # 40 MiB: several multipart parts are uploaded before the failure
                w.write({"__key__": f"b{i}", "bin": os.urandom(4 * 2**20)})
            uploads = s3_server.boto3_client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            assert [u["Key"] for u in uploads] == ["failed/big.tar"]  # really under way
            raise Boom
    fs.invalidate_cache()
    assert not fs.exists(url)
    uploads = s3_server.boto3_client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads == []  # aborted, not left to linger (and bill)
    with pytest.raises(Boom):
        with ShardWriter(f"{s3_bucket}/failed/s-%d.tar", maxcount=2, storage_options=options) as sw:
            for s in make_samples(3):
                sw.write(s)
            raise Boom
    fs.invalidate_cache()
    assert fs.ls(f"{s3_bucket}/failed", detail=False) == [f"{bucket}/failed/s-0.tar"]


def test_tar_gz_names_are_written_gzipped_and_reproducibly(tmp_path):
    import gzip
    import subprocess

    digests = []
    for run in range(2):
        url = str(tmp_path / f"run{run}" / "shard.tar.gz")
        with TarWriter(url) as writer:
            for i in range(20):
                writer.write({"__key__": f"k{i:03d}", "txt": b"x" * i, "cls": b"%d" % i})
        data = open(url, "rb").read()
        assert data[:2] == b"\x1f\x8b"
        gzip.decompress(data)  # a complete gzip stream
        digests.append(hashlib.sha256(data).hexdigest())
        listing = subprocess.run(["tar", "tzf", url], capture_output=True, text=True, check=True).stdout.split()
        assert listing[:2] == ["k000.cls", "k000.txt"] and len(listing) == 40
    assert digests[0] == digests[1]


# ------------------------------------------------------------------------------------------------
# write_batch: the path `shardflow create` takes


def odd_samples(n: int, seed: int, tar: bool = True) -> list[dict]:
    """Samples with what the fast header path must hand on: long and non-ASCII names (pax; a name
    that is not UTF-8 only for tar, records cannot hold it), empty, block-sized and large members
    (pieces of their own), mixed with tiny ones."""
    rng = random.Random(seed)
    sizes = [0, 1, 511, 512, 513, 40_000, 3000]
    keys = ["s/%05d", "deep/" * 25 + "%05d", "ü/%05d"] + (["raw\udcff/%05d"] if tar else [])
    out = []
    for i in range(n):
        key = rng.choice(keys) % i
        out.append({"__key__": key, "cls": b"%d" % i, "bin": os.urandom(rng.choice(sizes))})
    return out


@pytest.mark.parametrize("name", ["b-%04d.tar", "b-%04d.tar.gz", "b-%04d.cbors"])
@pytest.mark.parametrize("maxcount,maxsize", [(10**6, 3e9), (7, 3e9), (10**6, 60_000), (5, 20_000), (1, 1536)])
def test_write_batch_gives_the_shards_write_gives(tmp_path, name, maxcount, maxsize):
    from shardflow.shards.samples import sample_members

    samples = odd_samples(120, seed=maxcount, tar=".tar" in name)
    shards = {}
    for way in ("write", "batch"):
        with ShardWriter(str(tmp_path / way / name), maxcount=maxcount, maxsize=maxsize) as w:
            if way == "write":
                for s in samples:
                    w.write(s)
            else:
                members = [sample_members(s) for s in samples]
                for start in range(0, len(members), 33):  # batches that straddle shard boundaries
                    w.write_batch(members[start : start + 33])
        shards[way] = [(i.nsamples, i.nbytes, i.sha256, open(i.url, "rb").read()) for i in w.shards]
    assert shards["batch"] == shards["write"]
    assert sum(n for n, *_ in shards["batch"]) == len(samples)
