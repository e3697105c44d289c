"""epoch_size= below the dataset (issue 29 item 4): consecutive epochs cover every sample once before any
sample repeats (it used to read the same 70 of 100 samples every epoch); the same for a spec's quota."""

from __future__ import annotations

from collections import Counter

import pytest

from shardflow import ShardDataset
from shardflow.reader.split import _ranges_to_segments, pass_segments, shard_order
from shardflow.shards.writer import TarWriter


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cover")
    manifest = []
    for s, n in enumerate((10, 30, 7, 50, 3)):
        url = str(folder / f"s-{s}.tar")
        with TarWriter(url) as w:
            for k in range(n):
                w.write({"__key__": f"{s}_{k}", "txt": b"t"})
        manifest.append({"url": url, "nsamples": n})
    return str(folder / "s-{0..4}.tar"), manifest


@pytest.mark.parametrize("world, shardshuffle", [(1, False), (2, True)])
def test_epochs_below_the_total_cover_every_sample_before_repeating(shards, world, shardshuffle):
    spec, manifest = shards
    seen: list[str] = []
    for epoch in range(3):  # 3 x 70 = 210: two whole passes and 10 of the third
        for rank in range(world):
            ds = ShardDataset(spec, manifest=manifest, epoch_size=70, decode=None, rank=rank, world_size=world,
                              shardshuffle=shardshuffle)
            ds.set_epoch(epoch)
            seen.extend(s["__key__"] for s in ds)
    assert len(seen) == 210
    counts = Counter(seen)
    assert len(counts) == 100 and max(counts.values()) <= 3
    assert sorted(Counter(seen[:100]).values()) == [1] * 100  # the first 100 delivered: each sample once
    assert min(counts.values()) >= 2  # nothing left out for the third time round


def test_pass_windows_of_one_pass_are_the_natural_epochs():
    """epoch_size = the total reads exactly what an epoch without it reads (window e = epoch e's order)."""
    counts = [10, 30, 7, 50, 3]
    for epoch in range(3):
        natural = _ranges_to_segments(0, 100, shard_order(5, 5, epoch, True), counts)
        assert pass_segments(100 * epoch, 100 * (epoch + 1), counts, 5, True) == natural


def test_a_quota_below_the_collection_covers_it_over_epochs(shards):
    spec, manifest = shards
    mixed = {"dataset": [{"shards": spec}], "epoch": 40}
    seen: list[str] = []
    for epoch in range(5):  # 5 x 40 = 200: every sample twice
        ds = ShardDataset(mixed, manifest=manifest, decode=None)
        ds.set_epoch(epoch)
        seen.extend(s["__key__"] for s in ds)
    assert sorted(Counter(seen).values()) == [2] * 100
