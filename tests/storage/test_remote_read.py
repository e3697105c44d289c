"""Storage options, redaction, retry classification and the resumable remote reader.

The reader is exercised against a real HTTP server on 127.0.0.1 (threaded, Range + ETag support)
that injects faults on request: connections dropped mid-body, 503/429 throttling, the object replaced
or truncated between requests. S3 and GCS specifics live in test_s3.py / test_gcs.py.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import socket
import threading

import fsspec
import pytest

from shardflow.errors import ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.storage.options import (
    REDACTED,
    options_for,
    parse_storage_options,
    redact,
    redact_urls,
    scrub,
    secret_values,
    strip_redacted,
)
from shardflow.storage.remote_read import RemoteReader
from shardflow.storage.retry import FATAL, THROTTLED, TRANSIENT, RetryPolicy, call_with_retries, classify
from shardflow.storage.schemes import open_read
from shardflow.storage.sources import ObjectChangedError
from shardflow.storage.upload import make_abort_on_gc

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05, deadline=10)


# ------------------------------------------------------------------------------------------------
# options_for


def test_options_for_flat_dict_applies_everywhere():
    flat = {"key": "k", "client_kwargs": {"endpoint_url": "http://h"}}
    assert options_for("s3://b/x.tar", flat) == flat
    assert options_for("gs://b/x.tar", flat) == flat
    assert options_for("s3://b/x.tar", None) == {}
    out = options_for("s3://b/x.tar", flat)
    out["client_kwargs"]["endpoint_url"] = "changed"
    assert flat["client_kwargs"]["endpoint_url"] == "http://h"  # a fresh copy


def test_options_for_longest_prefix_wins_and_merges():
    options = {
        "anon": False,
        "s3://": {"key": "general", "client_kwargs": {"endpoint_url": "http://a", "region_name": "r1"}},
        "s3://bucket-a": {"key": "special", "client_kwargs": {"endpoint_url": "http://b"}},
        "gs://": {"token": "anon"},
    }
    a = options_for("s3://bucket-a/x/y.tar", options)
    assert a == {"anon": False, "key": "special", "client_kwargs": {"endpoint_url": "http://b", "region_name": "r1"}}
    other = options_for("s3://bucket-ab/y.tar", options)  # prefix matches only at a path boundary
    assert other["key"] == "general"
    assert options_for("gs://g/z.tar", options) == {"anon": False, "token": "anon"}
    assert options_for("/local/file.tar", options) == {"anon": False}
    assert options_for("s3://bucket-a", options)["key"] == "special"


def test_options_for_expands_environment_references(monkeypatch):
    monkeypatch.setenv("SF_TEST_SECRET", "s3cr3t-value")
    options = {"s3://": {"secret": "${SF_TEST_SECRET}", "key": "plain"}}
    assert options_for("s3://b/k", options)["secret"] == "s3cr3t-value"
    assert options_for("s3://b/k", options, resolve_env=False)["secret"] == "${SF_TEST_SECRET}"
    monkeypatch.delenv("SF_TEST_SECRET")
    with pytest.raises(KeyError, match="SF_TEST_SECRET"):
        options_for("s3://b/k", options)


def test_options_for_rejects_a_prefix_without_a_dict():
    with pytest.raises(TypeError, match="s3://b"):
        options_for("s3://b/x", {"s3://b": "oops"})


# ------------------------------------------------------------------------------------------------
# --storage-option parsing


def test_parse_storage_options():
    got = parse_storage_options([
        "anon=false",
        "client_kwargs.endpoint_url=http://127.0.0.1:9000",
        "client_kwargs.region_name=us-east-1",
        "default_block_size=8388608",
        'config_kwargs={"retries": {"max_attempts": 3}}',
        "secret=000123",  # secrets stay strings even when they look like numbers
        "profile=dev",
        "s3://bucket-a:key=AKIA",
        "s3://bucket-a:client_kwargs.endpoint_url=http://other:9000",
        "gs://:token=anon",
    ])
    assert got == {
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-1"},
        "default_block_size": 8388608,
        "config_kwargs": {"retries": {"max_attempts": 3}},
        "secret": "000123",
        "profile": "dev",
        "s3://bucket-a": {"key": "AKIA", "client_kwargs": {"endpoint_url": "http://other:9000"}},
        "gs://": {"token": "anon"},
    }
    assert options_for("s3://bucket-a/x", got)["client_kwargs"]["endpoint_url"] == "http://other:9000"
    assert options_for("s3://other/x", got)["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize("bad", ["novalue", "=x", "a..b=1", "s3://bucket=1"])
def test_parse_storage_options_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_storage_options([bad])


def test_parse_storage_option_error_never_shows_a_secret():
    with pytest.raises(ValueError) as info:
        parse_storage_options(["client_kwargs=1", "client_kwargs.secret=hunter22"])
    assert "hunter22" not in str(info.value)


# ------------------------------------------------------------------------------------------------
# redact / scrub


def test_redact_replaces_secret_values_everywhere():
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "wJalrXUtnFEMI",
        "token": "ya29.a0AfH6",
        "session_token": "FQoGZXIvYXdzE",
        "password": "hunter2",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_secret_access_key": "zzz"},
        "credentials": {"type": "service_account", "private_key": "-----BEGIN"},
        "anon": False,
        "s3://bucket-a": {"secret": "${MY_SECRET}", "key": "AKIA2"},
        "gs://": {"token": "google_default", "project": "p"},
        "list": [{"api_key": "k1"}, "plain"],
        "requester_pays": True,
    }
    red = redact(options)
    text = repr(red)
    for secret in ("AKIAEXAMPLE", "wJalrXUtnFEMI", "ya29", "FQoGZXIvYXdzE", "hunter2", "zzz", "BEGIN", "AKIA2", "k1"):
        assert secret not in text
    assert red["key"] == REDACTED and red["credentials"] == REDACTED
    assert red["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert red["anon"] is False and red["requester_pays"] is True
    assert red["s3://bucket-a"]["secret"] == "${MY_SECRET}"  # a reference is not a secret
    assert red["gs://"] == {"token": "google_default", "project": "p"}
    assert red["list"][1] == "plain"
    assert options["key"] == "AKIAEXAMPLE"  # the input is not modified


def test_strip_redacted_round_trip():
    options = {"key": "AKIA1", "secret": "s", "anon": False, "s3://b": {"secret": "${X}", "token": "t"},
               "client_kwargs": {"endpoint_url": "http://h"}}
    stored = redact(options)
    assert strip_redacted(stored) == {"anon": False, "s3://b": {"secret": "${X}"},
                                      "client_kwargs": {"endpoint_url": "http://h"}}


def test_redact_urls_in_strings():
    assert redact("https://user:pa55@host:8080/x.tar") == "https://***@host:8080/x.tar"
    presigned = "https://b.s3.amazonaws.com/k.tar?X-Amz-Credential=AKIA%2F2024&X-Amz-Signature=abcdef&x=1"
    out = redact_urls(f"failed to read {presigned} now")
    assert "abcdef" not in out and "AKIA" not in out and "x=1" in out and out.startswith("failed to read https://")
    assert redact({"url": "s3://bucket/key.tar"}) == {"url": "s3://bucket/key.tar"}


def test_scrub_removes_known_secrets_from_messages(monkeypatch):
    monkeypatch.setenv("SF_TEST_SECRET2", "env-secret-value")
    options = {"key": "AKIAXYZ", "secret": "${SF_TEST_SECRET2}", "s3://b": {"token": "tok-123456"}}
    assert set(secret_values(options)) == {"AKIAXYZ", "env-secret-value", "tok-123456"}
    msg = "InvalidAccessKeyId AKIAXYZ (sig env-secret-value, tok-123456) at http://u:p@h/x"
    out = scrub(msg, options)
    assert "AKIAXYZ" not in out and "env-secret-value" not in out and "tok-123456" not in out and "u:p" not in out


# ------------------------------------------------------------------------------------------------
# classification and retries


class _Resp(Exception):
    def __init__(self, status):
        super().__init__(f"HTTP {status}")
        self.status = status


def test_classify():
    assert classify(ConnectionResetError("reset")) == TRANSIENT
    assert classify(TimeoutError()) == TRANSIENT
    slow_down = "An error occurred (SlowDown) when calling GetObject: reduce your request rate"
    assert classify(OSError(5, slow_down)) == THROTTLED
    assert classify(_Resp(429)) == THROTTLED
    assert classify(_Resp(503)) == TRANSIENT
    assert classify(FileNotFoundError("x")) == FATAL
    assert classify(PermissionError("denied")) == FATAL
    assert classify(ValueError("bad")) == FATAL
    assert classify(ObjectChangedError("changed", url="s3://b/k")) == FATAL
    wrapped = OSError("wrapper")
    wrapped.__cause__ = ConnectionResetError("peer")
    assert classify(wrapped) == TRANSIENT


def test_call_with_retries_backs_off_then_succeeds():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("dropped")
        return "ok"

    assert call_with_retries(flaky, url="s3://b/k", what="read", retry=FAST) == "ok"
    assert len(calls) == 3


def test_call_with_retries_gives_up_with_the_url_and_no_secret():
    def always():
        raise ConnectionResetError("dropped while using secret SECRETVALUE123")

    with pytest.raises(ShardIOError) as info:
        call_with_retries(always, url="s3://b/k.tar", what="read at byte 0", retry=FAST,
                          storage_options={"secret": "SECRETVALUE123"})
    message = str(info.value)
    assert "s3://b/k.tar" in message and "5 attempts" in message and "SECRETVALUE123" not in message


def test_call_with_retries_does_not_retry_fatal_errors():
    calls = []

    def denied():
        calls.append(1)
        raise PermissionError("denied")

    with pytest.raises(ShardIOError, match="denied"):
        call_with_retries(denied, url="s3://b/k", what="open", retry=FAST)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------
# a real HTTP server with injected faults


class _Store:
    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.faults: list[tuple[str, int]] = []  # ("drop", after_bytes) | ("status", code)
        self.on_get = None  # callable(path, start) run before a GET is served
        self.gets = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: _Store

    def log_message(self, *args):
        pass

    def _object(self):
        data = self.store.objects.get(self.path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        return data

    def _etag(self, data):
        return '"%s"' % hashlib.md5(data).hexdigest()

    def do_HEAD(self):
        data = self._object()
        if data is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", self._etag(data))
        self.end_headers()

    def do_GET(self):
        store = self.store
        with store.lock:
            store.gets += 1
            fault = store.faults.pop(0) if store.faults else None
        rng = self.headers.get("Range", "")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        if store.on_get is not None:
            store.on_get(self.path, start)
        data = self._object()
        if data is None:
            return
        end = int(rng.split("-")[1]) + 1 if rng and rng.split("-")[1] else len(data)
        body = data[start:end]
        if fault and fault[0] == "status":
            self.send_response(fault[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", self._etag(data))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if fault and fault[0] == "drop":
            self.wfile.write(body[: fault[1]])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def http_store():
    store = _Store()
    handler = type("H", (_Handler,), {"store": store})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    store.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield store
    server.shutdown()
    server.server_close()


def _shard_bytes(n=40, size=50_000, seed=0):
    import random

    rnd = random.Random(seed)
    buf = io.BytesIO()
    with TarWriter(buf) as writer:
        for i in range(n):
            writer.write({"__key__": f"s/{i:05d}", "bin": rnd.randbytes(size), "cls": b"%d" % i})
    return buf.getvalue()


def _reader(store, name, **kw):
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    kw.setdefault("block_size", 64 * 1024)
    kw.setdefault("retry", FAST)
    return RemoteReader(f"{store.base}/{name}", fs, f"{store.base}/{name}", **kw)


@pytest.mark.parametrize("readahead", [0, 1, 3])
def test_reader_streams_in_blocks(http_store, readahead):
    data = os.urandom(1_000_003)
    http_store.objects["/a.bin"] = data
    with _reader(http_store, "a.bin", readahead=readahead) as r:
        assert r.size == len(data)
        got = [r.read(100_000) for _ in range(11)]
        assert b"".join(got) == data
        assert r.read(10) == b""
        r.seek(500_000)
        assert r.read(7) == data[500_000:500_007]
        assert r.tell() == 500_007
        r.seek(-3, io.SEEK_END)
        assert r.read() == data[-3:]
    assert http_store.gets >= 1_000_003 // (64 * 1024)


def test_reader_resumes_after_dropped_connections(http_store):
    data = _shard_bytes()
    http_store.objects["/s.tar"] = data
    # two blocks lose their connection part-way, one gets a 503, one a 429
    http_store.faults = [("drop", 1000), ("status", 503), ("drop", 30_000), ("status", 429)]
    with _reader(http_store, "s.tar", readahead=1) as r:
        samples = list(read_samples(r, "s.tar"))
        assert r.resumes == 4
    assert [s["__key__"] for s in samples] == [f"s/{i:05d}" for i in range(40)]


def test_reader_gives_up_after_bounded_retries_naming_the_url(http_store):
    http_store.objects["/s.tar"] = _shard_bytes(n=5)
    http_store.faults = [("status", 503)] * 50
    r = _reader(http_store, "s.tar", retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02))
    with pytest.raises(ShardIOError) as info:
        r.read()
    assert f"{http_store.base}/s.tar" in str(info.value) and "3 attempts" in str(info.value)
    r.close()


def test_reader_detects_object_replaced_during_read(http_store):
    data = _shard_bytes()
    http_store.objects["/s.tar"] = data
    replacement = _shard_bytes(seed=1)

    def replace_then_drop(path, start):
        if start >= 300_000 and http_store.objects["/s.tar"] is data:
            http_store.objects["/s.tar"] = replacement
            http_store.faults.append(("drop", 10))

    http_store.on_get = replace_then_drop
    with _reader(http_store, "s.tar", readahead=0) as r:
        with pytest.raises(ObjectChangedError, match="changed") as info:
            list(read_samples(r, r.url))
    assert "s.tar" in str(info.value)


def test_reader_reports_truncation_not_a_short_shard(http_store):
    data = _shard_bytes()
    http_store.objects["/s.tar"] = data

    def truncate(path, start):
        if start >= 500_000:
            http_store.objects["/s.tar"] = data[:600_000]

    http_store.on_get = truncate
    with _reader(http_store, "s.tar", readahead=0) as r:
        keys = []
        with pytest.raises(ShardIOError) as info:
            for sample in read_samples(r, r.url):
                keys.append(sample["__key__"])
    assert "s.tar" in str(info.value)
    assert len(keys) < 40


def test_open_read_http_returns_resumable_reader(http_store):
    http_store.objects["/s.tar"] = _shard_bytes(n=3)
    stream = open_read(f"{http_store.base}/s.tar", block_size=64 * 1024)
    try:
        assert isinstance(stream, RemoteReader)
        assert [s["__key__"] for s in read_samples(stream, "x")] == ["s/00000", "s/00001", "s/00002"]
    finally:
        stream.close()
    with pytest.raises(ShardIOError, match="no such file"):
        open_read(f"{http_store.base}/missing.tar")


# ------------------------------------------------------------------------------------------------
# uploads never publish on garbage collection


def test_dropped_upload_file_is_not_published_on_gc():
    import gc

    from fsspec.spec import AbstractBufferedFile

    published = []

    class Upload(AbstractBufferedFile):
        def _initiate_upload(self):
            pass

        def _upload_chunk(self, final=False):
            if final:
                published.append(self.path)
            return True

    fs = fsspec.filesystem("memory")
    f = make_abort_on_gc(Upload(fs, "x/y.tar", mode="wb"))
    f.write(b"partial")
    del f
    gc.collect()
    assert published == []
    g = make_abort_on_gc(Upload(fs, "x/z.tar", mode="wb"))
    g.write(b"whole")
    g.close()
    assert published == ["x/z.tar"]
