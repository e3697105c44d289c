"""The splitting rules of the reader (shardflow.reader.split), checked exhaustively on small cases.

These are pure functions of integers; the end-to-end tests with real DataLoader worker processes and
RANK/WORLD_SIZE are in test_rank_worker_split.py.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from shardflow.reader.split import (
    Consumer,
    assign,
    batch_count,
    mix,
    rank_length,
    rank_range,
    shard_order,
    worker_part,
)


def expand(segments, counts):
    """(shard, index) pairs a consumer yields for its segments, given the true counts."""
    out = []
    for seg in segments:
        stop = counts[seg.shard] if seg.stop is None else seg.stop
        out.extend((seg.shard, i) for i in range(seg.start, stop) if seg.take(i))
    return out


COUNTS = [[7], [3, 0, 5], [1, 1], [10, 4, 6, 9, 2], [5] * 7, [0, 0, 3], [2, 13, 1, 8, 5, 5, 7, 3, 11]]


@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("known", [True, False])
def test_every_sample_exactly_once(counts, world, workers, known):
    everything = sorted((s, i) for s, n in enumerate(counts) for i in range(n))
    for batch_size, epoch, shuffle in [(None, 0, False), (3, 1, True), (4, 2, True)]:
        got = []
        for rank in range(world):
            for worker in range(workers):
                a = assign(len(counts), Consumer(rank, world, worker, workers), counts=counts if known else None,
                           seed=5, epoch=epoch, shardshuffle=shuffle, batch_size=batch_size)
                mine = expand(a.segments, counts)
                if known:
                    assert a.expected == len(mine) and a.quota is None
                got.extend(mine)
        assert sorted(got) == everything, (batch_size, epoch)


@pytest.mark.parametrize("counts", COUNTS[1:])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("equalize", ["drop", "pad"])
def test_equalize_gives_equal_counts_and_batches(counts, world, equalize):
    total = sum(counts)
    batch_size = 2
    per_rank_samples, per_rank_batches = [], []
    seen = []
    for rank in range(world):
        nb = []
        samples = 0
        # the rank's number of batches must not depend on its number of workers
        for workers in (1, 2, 3):
            batches = 0
            rank_samples = []
            for worker in range(workers):
                a = assign(len(counts), Consumer(rank, world, worker, workers), counts=counts, seed=1, epoch=0,
                           shardshuffle=True, equalize=equalize, batch_size=batch_size)
                mine = expand(a.segments, counts)
                assert a.quota == len(mine)
                batches += batch_count(len(mine), batch_size, True)
                rank_samples += mine
            nb.append(batches)
            samples = len(rank_samples)
            if workers == 2:
                seen += rank_samples
        assert len(set(nb)) == 1, nb
        per_rank_batches.append(nb[0])
        per_rank_samples.append(samples)
        assert rank_length(counts, world, rank, equalize=equalize, epoch_size=None, batch_size=batch_size,
                           partial=True) == nb[0]
    assert len(set(per_rank_samples)) == 1 and len(set(per_rank_batches)) == 1
    if equalize == "drop":
        assert per_rank_samples[0] == total // world
        assert len(set(seen)) == len(seen)  # nothing repeated
    else:
        assert per_rank_samples[0] == -(-total // world)
        if total:
            assert set(seen) == {(s, i) for s, n in enumerate(counts) for i in range(n)}  # nothing lost


def test_rank_range_natural_split_differs_by_at_most_one():
    for total, world in itertools.product(range(0, 30), range(1, 7)):
        lengths = [rank_range(total, world, r, None, None)[1] for r in range(world)]
        assert sum(lengths) == total and max(lengths) - min(lengths) <= 1


def test_worker_parts_are_whole_batches_and_cover_the_rank():
    for n, workers, b, partial in itertools.product(range(0, 40), (1, 2, 3, 5), (None, 1, 4, 7), (True, False)):
        parts = [worker_part(n, workers, w, b, partial) for w in range(workers)]
        assert parts[0][0] == 0
        for (_a0, b0), (a1, _) in zip(parts, parts[1:]):
            assert b0 == a1
        used = parts[-1][1]
        assert used == (n if partial else (n // (b or 1)) * (b or 1))
        for a, e in parts[:-1]:
            assert (e - a) % (b or 1) == 0


def test_fewer_shards_than_consumers_splits_inside():
    counts = [12, 12]
    a = assign(2, Consumer(1, 2, 2, 3), counts=counts, seed=0, epoch=0, shardshuffle=False)
    assert a.split_inside and a.expected == 4
    u = assign(2, Consumer(1, 2, 2, 3), counts=None, seed=0, epoch=0, shardshuffle=False)
    assert u.split_inside and [s.step for s in u.segments] == [3]
    whole = assign(6, Consumer(0, 2, 0, 3), counts=None, seed=0, epoch=0, shardshuffle=False)
    assert not whole.split_inside


def test_shard_order_depends_on_seed_and_epoch_only():
    a = shard_order(50, seed=3, epoch=0, shuffle=True)
    assert a == shard_order(50, seed=3, epoch=0, shuffle=True)
    assert a != shard_order(50, seed=3, epoch=1, shuffle=True)
    assert a != shard_order(50, seed=4, epoch=0, shuffle=True)
    assert shard_order(5, 3, 0, False) == list(range(5))


@pytest.mark.slow
def test_mix_is_stable_across_processes():
    """mix() must not depend on Python's per-process hash salt."""
    code = "from shardflow.reader.split import mix; print(mix(1, 2, 3), mix(2**70, -5))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(s),
                                "PYTHONPATH": str(Path(__file__).resolve().parents[2])}).stdout for s in (1, 2)}
    assert len(outs) == 1
    assert outs.pop().split() == [str(mix(1, 2, 3)), str(mix(2**70, -5))]
    assert mix(1, 2) != mix(2, 1)


def test_equalize_without_counts_needs_epoch_size():
    with pytest.raises(ValueError, match="manifest="):
        assign(3, Consumer(), counts=None, seed=0, epoch=0, shardshuffle=False, equalize="drop")
    a = assign(3, Consumer(0, 2, 0, 1), counts=None, seed=0, epoch=0, shardshuffle=False, equalize="pad", epoch_size=9)
    assert a.quota == 5


def test_random_layouts():
    rng = random.Random(0)
    for _ in range(200):
        counts = [rng.randrange(0, 9) for _ in range(rng.randrange(1, 8))]
        world, workers = rng.randrange(1, 5), rng.randrange(1, 4)
        b = rng.choice([None, 1, 2, 5])
        got = []
        for rank in range(world):
            for worker in range(workers):
                a = assign(len(counts), Consumer(rank, world, worker, workers), counts=counts, seed=rng.randrange(9),
                           epoch=0, shardshuffle=False, batch_size=b)
                got += expand(a.segments, counts)
        assert sorted(got) == sorted((s, i) for s, n in enumerate(counts) for i in range(n))
