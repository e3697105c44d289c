"""Fixed counts per rank when samples go missing, and manifests that no longer match their shards.

- equalize= / epoch_size= give every rank the same count. A consumer (rank x worker) whose own part
  was dropped whole (map= returned None, a damaged shard) used to stop short: its rank yielded fewer
  batches than len(ds) and DDP's all_reduce hung on the others. Refill passes read its own part again
  and then the rest of the epoch (split.Assignment.refill).
- a manifest whose recorded size differs from the shard as it is now (rewritten after `shardflow
  index`) is reported under on_error (reader/manifest_check.py) instead of silently trusted.
"""

from __future__ import annotations

import io
import os
import tarfile
import warnings

import pytest

pytest.importorskip("torch")

from shardflow import Loader, ShardDataset  # noqa: E402
from shardflow.reader.manifest_check import StaleManifestError  # noqa: E402
from shardflow.reader.split import Consumer, assign  # noqa: E402
from tests.reader.test_dataset_loader import keys_of, spec_of, write_shards  # noqa: E402
from tests.reader.test_split import COUNTS, expand  # noqa: E402

SHARDS = [5, 3, 7, 1, 4]  # shard 2 holds samples k00008..k00014
DROPPED = {f"k{i:05d}" for i in range(8, 15)}


def drop_shard_2(sample):
    """map=: drop every sample of shard 2."""
    return None if sample["__key__"] in DROPPED else sample


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("refill")
    keys = write_shards(root / "d", SHARDS)
    return {"root": root, "keys": keys, "spec": spec_of(root / "d", len(SHARDS))}


def _dataset(spec, rank, world, **kw):
    kw = {"decode": None, "batch_size": 2, "equalize": "drop", "rank": rank, "world_size": world, **kw}
    return ShardDataset(spec, **kw)


# ------------------------------------------------------------------------------- refill (split)


@pytest.mark.parametrize("counts", COUNTS[1:])
@pytest.mark.parametrize("known", [True, False])
def test_refill_holds_every_other_sample_once(counts, known):
    """Own part + refill = every sample of the epoch once: a refill pass that gives nothing means
    nothing anywhere is left (the only case in which a consumer may stop short)."""
    everything = sorted((s, i) for s, n in enumerate(counts) for i in range(n))
    for world, workers in ((2, 1), (3, 2)):
        for rank in range(world):
            for worker in range(workers):
                a = assign(len(counts), Consumer(rank, world, worker, workers), counts=counts if known else None,
                           seed=3, epoch=1, shardshuffle=True, equalize="drop",
                           epoch_size=None if known else sum(counts), batch_size=2)
                own, rest = expand(a.segments, counts), expand(a.refill, counts)
                if not own:
                    continue
                assert sorted(own + rest) == everything
                assert not set(own) & set(rest)


def test_no_refill_without_a_quota():
    a = assign(3, Consumer(0, 2), counts=[4, 4, 4], seed=0, epoch=0, shardshuffle=False)
    assert a.quota is None and a.refill == ()


# ------------------------------------------------------------------------ refill (end to end)


def test_a_rank_whose_part_is_dropped_whole_still_fills_its_quota(shards):
    """world 5, equalize='drop': 4 samples a rank; rank 2's are all in shard 2, which map= drops.
    Before: rank 2 yielded 0 batches, the others 2 (len(ds) said 2 for all)."""
    got = {}
    for rank in range(5):
        ds = _dataset(shards["spec"], rank, 5, map=drop_shard_2)
        got[rank] = keys_of(ds)
        assert len(got[rank]) == 4 and len(ds) == 2 and len(list(ds)) == 2, (rank, got[rank])
        assert not DROPPED & set(got[rank])
    assert len(set(got[2])) == 4  # filled from the rest of the epoch: rank 3's first samples
    assert got[3].count("k00015") == 2  # a refill repeats the consumer's own samples first
    again = keys_of(_dataset(shards["spec"], 2, 5, map=drop_shard_2))
    assert again == got[2]  # deterministic


def test_a_damaged_shard_is_made_up_for_on_every_rank(shards, tmp_path):
    """The same with no map=: shard 2 replaced by 700 random bytes (on_error='warn' reads on)."""
    keys = write_shards(tmp_path / "d", SHARDS)
    with open(tmp_path / "d" / "s-002.tar", "wb") as f:
        f.write(os.urandom(700))
    spec = spec_of(tmp_path / "d", len(SHARDS))
    for rank in range(5):
        ds = _dataset(spec, rank, 5)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            got = keys_of(ds)
        assert len(got) == 4 and set(got) <= set(keys) - DROPPED, (rank, got)
        assert rank != 2 or len(set(got)) == 4


def test_resume_inside_a_refill_replays_the_rest(shards):
    """A state saved after rank 2's first batch (filled from the refill) resumes to exactly the rest."""
    ds = _dataset(shards["spec"], 2, 5, map=drop_shard_2, shuffle=8, shardshuffle=False, seed=4)
    it = iter(ds)
    first = next(it)
    state = ds.state_dict()
    rest = keys_of(it)
    again = _dataset(shards["spec"], 2, 5, map=drop_shard_2, shuffle=8, shardshuffle=False, seed=4)
    again.load_state_dict(state)
    assert keys_of(again) == rest and len(keys_of([first]) + rest) == 4


def test_resume_where_the_rest_of_a_pass_is_dropped_goes_on_to_the_next_pass(shards):
    """One rank, 3 of 20 samples kept by map=: the quota (20) takes 7 passes. A state saved inside
    pass 1, after its last kept sample, used to end the resumed epoch there (the fresh part of the
    pass gave nothing, taken as 'nothing left to repeat'), 7 batches short."""
    keep = {"k00000", "k00001", "k00002"}

    def keep_3(sample):
        return sample if sample["__key__"] in keep else None

    full = keys_of(_dataset(shards["spec"], 0, 1, map=keep_3))
    assert len(full) == 20 and set(full) == keep
    ds = _dataset(shards["spec"], 0, 1, map=keep_3)
    it = iter(ds)
    for _ in range(3):
        next(it)
    again = _dataset(shards["spec"], 0, 1, map=keep_3)
    again.load_state_dict(ds.state_dict())
    assert keys_of(again) == full[6:]


@pytest.mark.slow
def test_with_dataloader_workers_every_rank_yields_len_batches(shards):
    """The audit's case: world 2, 2 workers a rank, batch 2: rank 1's worker 0 holds only shard-2
    samples. Before: rank 1 yielded 3 batches against len(ds) = 5."""
    per_rank = []
    for rank in range(2):
        ds = _dataset(shards["spec"], rank, 2, map=drop_shard_2)
        batches = list(Loader(ds, num_workers=2))
        assert len(batches) == len(ds) == 5
        per_rank.append(keys_of(batches))
    assert all(len(k) == 10 and not DROPPED & set(k) for k in per_rank)


# ----------------------------------------------------------------------------- stale manifest


def _rewrite(path, n):
    """Replace a shard with `n` fresh samples (another size than the manifest recorded)."""
    with tarfile.open(path, "w") as t:
        for i in range(n):
            info = tarfile.TarInfo(f"new{i:04d}.txt")
            info.size = 3
            t.addfile(info, io.BytesIO(b"new"))


@pytest.fixture()
def grown(tmp_path):
    write_shards(tmp_path / "d", SHARDS)
    path = tmp_path / "d" / "s-001.tar"
    recorded = os.path.getsize(path)
    _rewrite(path, 30)
    return spec_of(tmp_path / "d", len(SHARDS)), str(path), recorded


def test_a_grown_shard_is_named_under_warn(grown):
    spec, changed, recorded = grown
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = keys_of(ShardDataset(spec, decode=None))
    stale = [str(w.message) for w in caught if "changed after it was indexed" in str(w.message)]
    assert len(stale) == 1 and changed in stale[0]
    assert f"{os.path.getsize(changed)} bytes now" in stale[0] and f"records {recorded} bytes and 3 samples" in stale[0]
    assert os.path.join(os.path.dirname(changed), "_shardflow", "summary.json") in stale[0]
    assert len(keys) == sum(SHARDS)  # read by the recorded count, as the message says


def test_a_changed_shard_stops_the_read_under_raise(grown):
    spec, changed, _ = grown
    with pytest.raises(StaleManifestError, match="changed after it was indexed") as info:
        list(ShardDataset(spec, decode=None, on_error="raise"))
    assert info.value.url == changed


def test_a_shrunk_shard_is_named_and_equal_counts_still_hold(tmp_path):
    """The reverse: shard 2 now holds 2 samples, the manifest says 7; equalize='drop' makes the
    counts up from other samples (and says why)."""
    write_shards(tmp_path / "d", SHARDS)
    _rewrite(tmp_path / "d" / "s-002.tar", 2)
    spec = spec_of(tmp_path / "d", len(SHARDS))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = [len(keys_of(_dataset(spec, rank, 2))) for rank in range(2)]
    assert counts == [10, 10]
    assert any("s-002.tar" in str(w.message) and "records" in str(w.message) for w in caught)
