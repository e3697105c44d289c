"""The training reader on a real S3 server (the `s3_server` / `s3_bucket` fixtures of conftest.py):
shards written to S3, epoch length from the run directory's summary.json found beside them, DataLoader
workers streaming from S3 into a local cache, and the next epoch served by the cache alone."""

from __future__ import annotations

import json

import fsspec
import pytest

pytest.importorskip("s3fs")
torch = pytest.importorskip("torch")

from shardflow import Loader, ShardDataset  # noqa: E402
from shardflow.errors import ShardIOError  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402
from shardflow.storage.schemes import open_write  # noqa: E402
from tests.reader.test_dataset_loader import jpeg, keys_of  # noqa: E402


def test_s3_reader_with_cache(s3_server, s3_bucket, tmp_path):
    options = s3_server.storage_options
    base = f"{s3_bucket}/train"
    keys = []
    with ShardWriter(f"{base}/s-%03d.tar", maxcount=9, storage_options=options) as writer:
        for i in range(30):
            writer.write({"__key__": f"k{i:03d}", "jpg": jpeg(i), "cls": str(i).encode()})
            keys.append(f"k{i:03d}")
    infos = writer.shards
    assert len(infos) == 4
    with open_write(f"{base}/_shardflow/summary.json", options) as f:
        f.write(json.dumps({"shards": [x.to_json() for x in infos]}).encode())

    cache = tmp_path / "cache"
    ds = ShardDataset(f"{base}/s-{{000..003}}.tar", storage_options=options, cache_dir=str(cache),
                      decode="torchrgb8", batch_size=4, shuffle=8, seed=1)
    assert ds.counts == [9, 9, 9, 3] and len(ds) == 8  # the manifest was found on S3
    loader = Loader(ds, num_workers=2)
    first = keys_of(loader)
    assert sorted(first) == keys
    cached = sorted(p.name for p in cache.iterdir())
    assert len(cached) == 4 and all(name.endswith(".tar") and not name.startswith(".") for name in cached)
    assert sum(p.stat().st_size for p in cache.iterdir()) == sum(x.nbytes for x in infos)

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    for info in infos:
        fs.rm(info.url)
    second = keys_of(loader)  # epoch 1: nothing left on S3, all from the cache
    assert sorted(second) == keys and second != first and loader.epoch == 1

    with pytest.raises(ShardIOError, match="s-000.tar"):
        list(ShardDataset(f"{base}/s-{{000..003}}.tar", storage_options=options, manifest=False))
