"""Streaming GCS end to end against fake-gcs-server on 127.0.0.1 (the `gcs_server` fixture).

Round trips, resumable uploads that never publish a partial object (error, garbage collection),
reads pinned to the generation seen at open, a read across a server restart, and bucket globs.
"""

from __future__ import annotations

import gc
import hashlib
import threading
import time

import pytest

from shardflow import urls
from shardflow.errors import ShardIOError
from shardflow.remote import ObjectChangedError, RemoteReader, RetryPolicy
from shardflow.samples import read_samples
from shardflow.writer import ShardWriter, TarWriter
from storage_samples import make_samples, strip_url, write_shard

pytest.importorskip("gcsfs")

MB = 2**20


class Boom(Exception):
    pass


def test_round_trip_with_shardwriter(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    samples = make_samples(25, 30_000, prefix="g")
    with ShardWriter(f"{gcs_bucket}/rt/part-%04d.tar", maxcount=10, storage_options=options) as writer:
        for sample in samples:
            writer.write(sample)
    fs = gcs_server.filesystem()
    for info in writer.shards:
        data = fs.cat_file(info.url)
        assert hashlib.sha256(data).hexdigest() == info.sha256
    found = urls.expand(f"{gcs_bucket}/rt/part-*.tar", options)
    assert found == [i.url for i in writer.shards]
    got = [strip_url(s) for url in found for s in read_samples(url, storage_options=options)]
    assert got == samples


def test_large_resumable_upload_round_trip(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    url = f"{gcs_bucket}/big/one.tar"
    samples = make_samples(10, 3 * MB, seed=2, prefix="g")  # 30 MB: several resumable-upload chunks
    write_shard(url, samples, options)
    with urls.open_read(url, options) as stream:
        assert isinstance(stream, RemoteReader)
        assert [strip_url(s) for s in read_samples(stream, url)] == samples


def test_failed_write_mid_upload_leaves_no_object(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    url = f"{gcs_bucket}/fail/big.tar"
    with pytest.raises(Boom):
        with TarWriter(url, storage_options=options) as writer:
            for sample in make_samples(24, 1 * MB, prefix="g"):
                writer.write(sample)
            upload = writer._atomic._file
            deadline = time.monotonic() + 20  # bytes reach the upload on a background thread
            while getattr(upload, "location", None) is None:
                assert time.monotonic() < deadline, "the resumable upload never started"
                time.sleep(0.02)
            raise Boom()
    assert not gcs_server.filesystem().exists(url)


@pytest.mark.parametrize("size", [100_000, 20 * MB], ids=["simple", "resumable"])
def test_dropped_writer_publishes_nothing(gcs_server, gcs_bucket, size):
    url = f"{gcs_bucket}/gc/dropped-{size}.tar"

    def write_and_drop():
        writer = TarWriter(url, storage_options=gcs_server.storage_options)
        for sample in make_samples(max(1, size // MB), min(size, MB), prefix="g"):
            writer.write(sample)

    write_and_drop()
    gc.collect()
    time.sleep(0.5)  # gcsfs would run its deferred close on a thread by now
    assert not gcs_server.filesystem().exists(url)


def test_object_replaced_during_read_is_detected(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    url = f"{gcs_bucket}/repl/a.tar"
    samples = make_samples(20, 300_000, seed=3, prefix="g")
    write_shard(url, samples, options)
    with urls.open_read(url, options, block_size=512 * 1024, readahead=0) as stream:
        it = read_samples(stream, url)
        assert strip_url(next(it)) == samples[0]
        write_shard(url, make_samples(20, 300_000, seed=4, prefix="g"), options)
        with pytest.raises(ObjectChangedError) as info:
            list(it)
    assert url in str(info.value)


def test_read_resumes_after_server_restart(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    url = f"{gcs_bucket}/restart/a.tar"
    samples = make_samples(30, 400_000, seed=5, prefix="g")
    write_shard(url, samples, options)
    stream = urls.open_read(url, options, block_size=1 * MB, readahead=1,
                            retry=RetryPolicy(attempts=40, base_delay=0.1, max_delay=1.0, deadline=90))
    got = []
    restarter = None
    try:
        it = read_samples(stream, url)
        for _ in range(4):
            got.append(strip_url(next(it)))
        gcs_server.stop()
        restarter = threading.Timer(1.5, gcs_server.start)
        restarter.start()
        got.extend(strip_url(s) for s in it)
    finally:
        if restarter is not None:
            restarter.join()
        gcs_server.ensure_running()
        stream.close()
    assert got == samples


def test_glob_and_missing(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    fs = gcs_server.filesystem()
    for name in ["train-0.tar", "train-1.tar", "val-0.tar", "train-d/x.tar"]:
        fs.pipe_file(f"{gcs_bucket}/ds/{name}", b"x")
    assert urls.expand(f"{gcs_bucket}/ds/train-*.tar", options) == [
        f"{gcs_bucket}/ds/train-0.tar", f"{gcs_bucket}/ds/train-1.tar"]
    with pytest.raises(ShardIOError, match="no such file"):
        urls.open_read(f"{gcs_bucket}/ds/none.tar", options)
