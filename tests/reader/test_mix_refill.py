"""Equal counts per rank for a mixed dataset spec when samples go missing.

A spec's quotas give every rank `quota // world` samples of each collection. A consumer (rank x
worker) whose samples went missing (map= returned None, a damaged shard) used to read its mixed
sequence once and stop short: its rank yielded fewer batches than len(ds), and DDP's all_reduce hung
on the other ranks. It now refills like the plain path (stream.EpochStream's passes): its own mixed
sequence again, then the rest of every collection's epoch (MixPlan.refill_plan).

(`equalize=` is refused for a spec: its quotas already fix the counts; `epoch_size=` sets them.)
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("torch")

import shardflow as sf  # noqa: E402
from tests.reader.test_dataset_loader import keys_of  # noqa: E402
from tests.reader.test_mix import _collection  # noqa: E402

# a: 2 shards x 8, b: 2 shards x 6 (counts known): over 2 ranks each rank reads one whole shard of
# each collection, 14 samples, 7 batches of 2
PER_RANK = 14


def _spec(root, *, counts=True):
    return {"dataset": [{"shards": _collection(root / "a", "a", 2, 8, summary=counts)},
                        {"shards": _collection(root / "b", "b", 2, 6, summary=counts)}]}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return _spec(tmp_path_factory.mktemp("mixrefill"))


def _dataset(spec, rank, **kw):
    kw = {"decode": None, "batch_size": 2, "seed": 1, "rank": rank, "world_size": 2, **kw}
    return sf.ShardDataset(spec, **kw)


def _dropping(keys):
    """map=: drop every sample in `keys`."""
    return lambda sample: None if sample["__key__"] in keys else sample


def _quiet_keys(ds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 'ran out of samples' / refill lines
        return keys_of(ds)


@pytest.mark.parametrize("extra", [{}, {"epoch_size": 20}], ids=["quotas-from-counts", "epoch_size"])
def test_a_rank_whose_mixed_part_is_dropped_whole_still_yields_len_batches(spec, extra):
    """map= drops every sample rank 1 reads (one shard of each collection). Before: rank 1 yielded
    0 batches, rank 0 len(ds)."""
    own = set(keys_of(_dataset(spec, 1, **extra)))
    per_rank = len(own)  # 14 (7 batches); epoch_size=20: 5 + 4 (5 batches, the last partial)
    drop = _dropping(own)
    for rank in (0, 1):
        ds = _dataset(spec, rank, map=drop, **extra)
        batches = list(ds)
        keys = keys_of(batches)
        assert len(batches) == len(ds) and len(keys) == per_rank, (rank, keys)
        assert not own & set(keys)
        assert len(set(keys)) == len(keys)  # filled from the rest of the epoch: each sample once
        if rank == 1:
            assert {k.split("/")[0] for k in keys} == {"a", "b"}  # both collections had samples left
            assert _quiet_keys(_dataset(spec, 1, map=drop, **extra)) == keys  # deterministic


def test_a_damaged_shard_of_one_collection_is_made_up_for(tmp_path):
    """No map=: the shard of `a` that rank 1 reads replaced by random bytes (on_error='warn'). Rank 1's
    refill reads its own mixed sequence again (its 6 `b` samples twice), then `a`'s rest."""
    spec = _spec(tmp_path)
    before = keys_of(_dataset(spec, 1))
    shard = next(k for k in before if k.startswith("a/")).split("/")[1]
    with open(tmp_path / "a" / f"a-{shard}.tar", "wb") as f:
        f.write(os.urandom(700))
    for rank in (0, 1):
        ds = _dataset(spec, rank)
        keys = _quiet_keys(ds)
        assert len(keys) == PER_RANK and not any(k.startswith(f"a/{shard}/") for k in keys), (rank, keys)
        if rank == 1:
            assert any(k.startswith("a/") for k in keys) and len(set(keys)) == 8  # 6 of b, 2 of a's rest


def test_counts_unknown_with_an_epoch_refills_from_the_other_ranks_units(tmp_path):
    """No summary.json, `epoch: 20`: each rank cycles its round-robin shards; when all of rank 1's are
    dropped, its refill reads the other consumers' units."""
    spec = {**_spec(tmp_path, counts=False), "epoch": 20}
    own = set(keys_of(_dataset(spec, 1)))
    for rank in (0, 1):
        ds = _dataset(spec, rank, map=_dropping(own))
        keys = _quiet_keys(ds)
        assert len(keys) == 2 * len(ds) == 10 and not own & set(keys), (rank, keys)


def test_resume_inside_a_mixed_refill_replays_the_rest(spec):
    own = set(keys_of(_dataset(spec, 1)))

    def make():
        return _dataset(spec, 1, map=_dropping(own), shuffle=4)

    full = _quiet_keys(make())
    ds = make()
    it = iter(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = keys_of([next(it), next(it)])
    state = ds.state_dict()
    it.close()
    again = make()
    again.load_state_dict(state)
    assert first + _quiet_keys(again) == full and len(full) == PER_RANK


@pytest.mark.slow
def test_with_dataloader_workers_every_rank_yields_len_batches(spec):
    """Loader with 2 workers a rank: both workers of rank 1 have their whole slice dropped. (Each
    worker fills from the rest of the epoch on its own, so they may fill with the same samples.)"""
    own = set(keys_of(_dataset(spec, 1)))
    for rank in (0, 1):
        ds = _dataset(spec, rank, map=_dropping(own))
        batches = list(sf.Loader(ds, num_workers=2))
        keys = keys_of(batches)
        assert len(batches) == len(ds) == 7 and len(keys) == PER_RANK and not own & set(keys), (rank, keys)
