"""The reader's shard cache on a real S3 server (the `s3_server` / `s3_bucket` fixtures): a shard
replaced under the same URL (a rerun of the job that made it) is read again, its new samples served,
while an unchanged shard keeps being served from its cached copy."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("torch")

from shardflow import ShardDataset  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402


def write_shard(base: str, options: dict, index: int, keys: list[str]) -> None:
    with ShardWriter(f"{base}/s-%03d.tar", start_index=index, maxcount=10**6, storage_options=options) as w:
        for key in keys:
            w.write({"__key__": key, "cls": key[-3:].encode()})


def test_a_shard_replaced_on_s3_is_read_again(s3_server, s3_bucket, tmp_path):
    options = s3_server.storage_options
    base = f"{s3_bucket}/train"
    write_shard(base, options, 0, [f"a{i:03d}" for i in range(5)])
    write_shard(base, options, 1, [f"b{i:03d}" for i in range(5)])
    cache = tmp_path / "cache"
    ds = ShardDataset(f"{base}/s-{{000..001}}.tar", storage_options=options, manifest=False, decode=None,
                      cache_dir=str(cache))
    first = [s["__key__"] for s in ds]
    assert first == [f"a{i:03d}" for i in range(5)] + [f"b{i:03d}" for i in range(5)]
    inodes = {p.name: os.stat(p).st_ino for p in cache.iterdir()}
    assert len(inodes) == 2

    write_shard(base, options, 0, [f"c{i:03d}" for i in range(5)])  # same URL, same size, new bytes
    second = [s["__key__"] for s in ds]
    assert second == [f"c{i:03d}" for i in range(5)] + [f"b{i:03d}" for i in range(5)]
    now = {p.name: os.stat(p).st_ino for p in cache.iterdir()}
    assert len(now) == 2 and len(set(now.items()) & set(inodes.items())) == 1  # shard 1's entry untouched
