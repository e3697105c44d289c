"""GCS-specific behaviour against fake-gcs-server on 127.0.0.1 (the `gcs_server` fixture).

What every store must do (round trips, failed and dropped writes publishing nothing, a read across a
server restart, an object replaced during a read, globs) is the storage contract, run on GCS among
others in test_contract.py. Here: what only GCS does, reads pinned to the object generation
seen at open and globs listed once with a server-side prefix.
"""

from __future__ import annotations

import fsspec
import pytest

from shardflow.storage.paths import filesystem
from shardflow.storage.sources import GCSSource, ObjectChangedError, make_source
from shardflow.storage.specs import expand
from tests.support.storage_samples import make_samples, write_shard

pytest.importorskip("gcsfs")


def test_reads_are_pinned_to_the_generation_seen_at_open(gcs_server, gcs_bucket):
    options = gcs_server.storage_options
    url = f"{gcs_bucket}/pin/a.tar"
    write_shard(url, make_samples(5, 1000, prefix="g"), options)
    generation = gcs_server.filesystem().info(url)["generation"]
    fs, path = filesystem(url, options)
    source = make_source(fs, path, url)
    assert isinstance(source, GCSSource)
    source.stat()
    assert str(source.generation) == str(generation)
    assert len(source.fetch(0, 100)) == 100
    write_shard(url, make_samples(5, 1000, seed=1, prefix="g"), options)  # a new generation
    with pytest.raises(ObjectChangedError, match="generation") as info:
        source.fetch(0, 100)
    assert url in str(info.value)


def test_glob_lists_once_with_a_server_side_prefix(gcs_server, gcs_bucket, monkeypatch):
    options = gcs_server.storage_options
    fs = gcs_server.filesystem()
    for name in ["train-0.tar", "train-1.tar", "val-0.tar", "train-d/x.tar", "other/train-9.tar"]:
        fs.pipe_file(f"{gcs_bucket}/ds/{name}", b"x")
    shared = fsspec.filesystem("gs", **options)  # the cached instance expand() will use
    calls = []
    original = shared._call_list_objects

    async def counting(bucket, **kwargs):
        calls.append(kwargs.get("prefix"))
        return await original(bucket, **kwargs)

    monkeypatch.setattr(shared, "_call_list_objects", counting)
    got = expand(f"{gcs_bucket}/ds/train-*.tar", options)
    assert got == [f"{gcs_bucket}/ds/train-0.tar", f"{gcs_bucket}/ds/train-1.tar"]
    assert calls == ["ds/train-"]  # one listing, of the keys that start with the pattern's literal part
