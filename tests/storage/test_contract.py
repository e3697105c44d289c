"""The storage contract: what every store shardflow reads from and writes to must guarantee.

One set of cases, run against four backends (the model is fsspec's `fsspec/tests/abstract/`): a
local folder, `memory://`, S3 (SeaweedFS) and GCS (fake-gcs-server), the last two real servers from
conftest.py. A case asks a backend only for what differs between stores (does it pin versions, has
it a server to restart, how does one count its listings); the expected values are the same for all.

Store-specific behaviour (credentials, request counting with server-side prefixes, per-prefix
options, jobs over object storage) stays in test_s3.py / test_gcs.py.
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
import time
import uuid

import fsspec
import pytest

from shardflow.errors import ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter
from shardflow.storage.atomic import temp_name
from shardflow.storage.remote_read import RemoteReader
from shardflow.storage.retry import RetryPolicy
from shardflow.storage.schemes import open_read, open_write
from shardflow.storage.sources import ObjectChangedError
from shardflow.storage.specs import expand
from tests.support.storage_samples import make_samples, strip_url, write_shard

MB = 2**20


class Boom(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# the backends


class Backend:
    """One store under test: a fresh folder URL (`root`), its storage options, a filesystem to check with.

    Flags say what the contract allows to differ: `pins_versions` (a reader of a replaced object
    fails with ObjectChangedError; elsewhere it goes on with the old bytes), `server` (a server
    that can be stopped mid-read), `counts_resumes` (the client's own retries do not hide an outage
    from the reader's resume counter).
    """

    name = "?"
    pins_versions = False
    changed_mark = ""  # what the ObjectChangedError of a replaced object says
    counts_resumes = False
    server = None

    def __init__(self, root: str, options: dict | None, fs) -> None:
        self.root = root
        self.options = options
        self.fs = fs

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def put(self, url: str, data: bytes) -> None:
        self.fs.pipe_file(url, data)

    def exists(self, url: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(url)

    def names(self, folder: str) -> list[str]:
        """Sorted basenames in `folder` (hidden ones included); [] when it does not exist."""
        self.fs.invalidate_cache()
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(folder, detail=False))
        except FileNotFoundError:
            return []

    def upload_started(self, upload) -> bool:
        """Whether bytes written to `upload` have reached the store (uploads run on a thread)."""
        return True

    def check_large_upload(self, upload) -> None:
        """Store-specific proof that a large write went up the streaming way."""

    def unfinished_uploads(self, url: str) -> list:
        """Uploads of `url` begun and never completed nor aborted."""
        return []

    def restart_options(self) -> dict | None:
        """Options for a read across a server restart: the client's own retries kept short."""
        return self.options

    def count_listings(self, monkeypatch) -> list:
        """A list that grows by one per listing request expand() makes."""
        raise NotImplementedError


class LocalBackend(Backend):
    name = "local"

    def put(self, url: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(url), exist_ok=True)
        with open(url, "wb") as f:
            f.write(data)

    def count_listings(self, monkeypatch) -> list:
        return _count_calls(monkeypatch, fsspec.filesystem("file"), "ls")  # one per folder listed


class MemoryBackend(Backend):
    name = "memory"

    def count_listings(self, monkeypatch) -> list:
        # memory's find() is one pass over the whole store: its listing (glob goes through it)
        return _count_calls(monkeypatch, fsspec.filesystem("memory"), "find")


class S3Backend(Backend):
    name = "s3"
    pins_versions = True
    changed_mark = "changed"
    counts_resumes = True

    def upload_started(self, upload) -> bool:
        return upload.mpu is not None and len(upload.parts) >= 1

    def check_large_upload(self, upload) -> None:
        assert upload.mpu is not None  # it went up as a multipart upload

    def unfinished_uploads(self, url: str) -> list:
        bucket, key = url[5:].split("/", 1)
        try:
            out = self.server.boto3_client().list_multipart_uploads(Bucket=bucket, Prefix=key)
        except Exception as exc:  # noqa: BLE001 - a server without the call: nothing to check
            pytest.skip(f"server cannot list multipart uploads: {exc}")
        return [u for u in out.get("Uploads", []) if u["Key"] == key]

    def restart_options(self) -> dict:
        # botocore's own retries off, so that the outage reaches shardflow's resume path
        return {**self.options, "config_kwargs": {"retries": {"max_attempts": 1}}}

    def count_listings(self, monkeypatch) -> list:
        shared = fsspec.filesystem("s3", **self.options)  # the cached instance expand() will use
        calls: list = []
        original = shared._call_s3

        async def counting(method, *args, **kwargs):
            if method.startswith("list_objects"):
                calls.append(kwargs.get("Prefix"))
            return await original(method, *args, **kwargs)

        monkeypatch.setattr(shared, "_call_s3", counting)
        return calls


class GCSBackend(Backend):
    name = "gcs"
    pins_versions = True

    def upload_started(self, upload) -> bool:
        return getattr(upload, "location", None) is not None  # the resumable upload has begun

    def count_listings(self, monkeypatch) -> list:
        shared = fsspec.filesystem("gs", **self.options)  # the cached instance expand() will use
        calls: list = []
        original = shared._call_list_objects

        async def counting(bucket, **kwargs):
            calls.append(kwargs.get("prefix"))
            return await original(bucket, **kwargs)

        monkeypatch.setattr(shared, "_call_list_objects", counting)
        return calls


def _count_calls(monkeypatch, fs, method: str) -> list:
    calls: list = []
    original = getattr(fs, method)

    def counting(path, *args, **kwargs):
        calls.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(fs, method, counting)
    return calls


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.servers),
                        pytest.param("gcs", marks=pytest.mark.servers)])
def store(request, tmp_path):
    """A Backend with a fresh, empty root; the servers start only for the cases that use them."""
    if request.param == "local":
        yield LocalBackend(str(tmp_path / "store"), None, fsspec.filesystem("file"))
    elif request.param == "memory":
        root = f"memory:///sf-contract-{uuid.uuid4().hex[:12]}"
        backend = MemoryBackend(root, None, fsspec.filesystem("memory"))
        yield backend
        if backend.fs.exists(root):
            backend.fs.rm(root, recursive=True)
    elif request.param == "s3":
        pytest.importorskip("s3fs")
        server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
        backend = S3Backend(bucket, server.storage_options, server.filesystem())
        backend.server = server
        yield backend
    else:
        pytest.importorskip("gcsfs")
        server, bucket = request.getfixturevalue("gcs_server"), request.getfixturevalue("gcs_bucket")
        backend = GCSBackend(bucket, server.storage_options, server.filesystem())
        backend.server = server
        yield backend


def _eventually(check, timeout=20.0):
    """Wait for `check()` to hold: TarWriter hands bytes to the upload on a background thread."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------------
# round trips


def test_shardwriter_round_trip(store):
    options = store.options
    samples = make_samples(35, 20_000)
    with ShardWriter(store.url("rt/shard-%06d.tar"), maxcount=10, storage_options=options) as writer:
        for sample in samples:
            writer.write(sample)
    infos = writer.shards
    assert [i.nsamples for i in infos] == [10, 10, 10, 5]
    for info in infos:
        data = store.fs.cat_file(info.url)
        assert len(data) == info.nbytes and hashlib.sha256(data).hexdigest() == info.sha256
    shard_urls = expand(store.url("rt/shard-*.tar"), options)
    assert shard_urls == [i.url for i in infos]
    got = [strip_url(s) for url in shard_urls for s in read_samples(url, storage_options=options)]
    assert got == samples


def test_large_round_trip_and_reader_is_streaming(store):
    options = store.options
    samples = make_samples(12, 3 * MB, seed=1)  # 36 MB: S3 multipart in 16 MiB parts, GCS resumable chunks
    url = store.url("big/one.tar")
    with TarWriter(url, storage_options=options) as writer:
        for sample in samples:
            writer.write(sample)
    assert writer.closed
    store.check_large_upload(writer._atomic._file)
    stream = open_read(url, options)
    if store.pins_versions:
        assert isinstance(stream, RemoteReader) and stream.block_size == 8 * MB
    with stream:
        got = [strip_url(s) for s in read_samples(stream, url)]
    assert got == samples


def test_open_write_then_open_read(store):
    url = store.url("raw/blob.bin")
    data = os.urandom(300_000)
    with open_write(url, store.options) as f:
        f.write(data[:100_000])
        f.write(data[100_000:])
    with open_read(url, store.options) as f:
        assert f.read() == data


def test_missing_object_is_a_shard_io_error_naming_the_url(store):
    url = store.url("nope.tar")
    with pytest.raises(ShardIOError, match="no such file") as info:
        open_read(url, store.options)
    assert url in str(info.value)


# ------------------------------------------------------------------------------------------------
# nothing half-written under a final name


def test_failed_write_leaves_nothing(store):
    url = store.url("fail/big.tar")
    with pytest.raises(Boom):
        with TarWriter(url, storage_options=store.options) as writer:
            for sample in make_samples(30, 1 * MB):
                writer.write(sample)
            upload = writer._atomic._file
            _eventually(lambda: store.upload_started(upload))  # parts reached the store
            raise Boom("fn failed after 30 MB")
    assert not store.exists(url)
    assert store.names(store.url("fail")) == []  # no temp left either
    assert store.unfinished_uploads(url) == []  # aborted, not left behind


def test_failed_small_write_leaves_nothing(store):
    url = store.url("fail/small.tar")
    with pytest.raises(Boom):
        with TarWriter(url, storage_options=store.options) as writer:
            writer.write(make_samples(1, 1000)[0])
            raise Boom()
    assert not store.exists(url)


def test_shardwriter_error_keeps_committed_shards_only(store):
    options = store.options
    with pytest.raises(Boom):
        with ShardWriter(store.url("sw/part-%03d.tar"), maxsize=12 * MB, storage_options=options) as writer:
            for sample in make_samples(30, 1 * MB):
                writer.write(sample)
            raise Boom()
    names = store.names(store.url("sw"))
    assert names == ["part-000.tar", "part-001.tar"]  # the third (in progress) never appeared
    for name in names:
        assert len(list(read_samples(store.url(f"sw/{name}"), storage_options=options))) == 11


@pytest.mark.slow
@pytest.mark.parametrize("size", [200_000, 20 * MB], ids=["small", "large"])
def test_dropped_writer_publishes_nothing(store, size):
    url = store.url(f"gc/dropped-{size}.tar")

    def write_and_drop():
        writer = TarWriter(url, storage_options=store.options)
        written = 0
        for sample in make_samples(max(1, size // MB), min(size, MB)):
            writer.write(sample)
            written += 1
        assert written
        # no close(), no abort(): an error unwound past it or a generator was abandoned

    write_and_drop()
    gc.collect()
    time.sleep(0.5)  # a deferred close (gcsfs), if any, would have run by now
    assert not store.exists(url)
    if size > 16 * MB:
        assert store.unfinished_uploads(url) == []


# ------------------------------------------------------------------------------------------------
# reads: never a mix of two versions, resumed across an outage


def test_object_replaced_during_read(store):
    options = store.options
    url = store.url("repl/a.tar")
    samples = make_samples(20, 300_000, seed=7)
    write_shard(url, samples, options)
    with open_read(url, options, block_size=512 * 1024, readahead=0) as stream:
        it = read_samples(stream, url)
        first = [next(it) for _ in range(3)]
        assert [strip_url(s) for s in first] == samples[:3]
        write_shard(url, make_samples(20, 300_000, seed=8), options)  # same size, new bytes
        if store.pins_versions:
            with pytest.raises(ObjectChangedError) as info:
                list(it)
            assert url in str(info.value) and store.changed_mark in str(info.value)
        else:  # the open file is the old version to its end
            assert [strip_url(s) for s in it] == samples[3:]


def test_read_resumes_after_server_restart(store):
    if store.server is None:
        pytest.skip("no server")
    url = store.url("restart/a.tar")
    samples = make_samples(40, 500_000, seed=5)
    write_shard(url, samples, store.options)
    stream = open_read(url, store.restart_options(), block_size=1 * MB, readahead=1,
                       retry=RetryPolicy(attempts=40, base_delay=0.1, max_delay=1.0, deadline=90))
    got = []
    restarter = None
    try:
        it = read_samples(stream, url)
        for _ in range(5):
            got.append(strip_url(next(it)))
        store.server.stop()
        restarter = threading.Timer(2.0, store.server.start)
        restarter.start()
        got.extend(strip_url(s) for s in it)
    finally:
        if restarter is not None:
            restarter.join()
        store.server.ensure_running()
        stream.close()
    assert got == samples  # every sample, in order, none short
    if store.counts_resumes:
        assert stream.resumes >= 1


# ------------------------------------------------------------------------------------------------
# globs


def test_glob_lists_once_and_skips_hidden_temps(store, monkeypatch):
    for name in ["train-0.tar", "train-1.tar", "val-0.tar", "train-d/x.tar"]:
        store.put(store.url(f"ds/{name}"), b"x")
    store.put(temp_name(store.url("ds/train-2.tar")), b"x")  # a writer's temp: hidden, not a shard
    listings = store.count_listings(monkeypatch)
    got = expand(store.url("ds/train-*.tar"), store.options)
    assert got == [store.url("ds/train-0.tar"), store.url("ds/train-1.tar")]
    assert len(listings) == 1
    with pytest.raises(ShardIOError, match="matched no shards"):
        expand(store.url("ds/nothing-*.tar"), store.options)
