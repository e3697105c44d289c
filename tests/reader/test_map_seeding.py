"""map= randomness in the training reader is seeded from (seed, epoch, sample key): the same run gives
the same augmentation on rerun, on any number of workers, after a resume and in kept (persistent)
workers; another epoch or another seed gives new draws; the caller's own generators are left alone."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardflow as sf  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeded")
    with ShardWriter(os.path.join(d, "s-%03d.tar"), maxcount=6) as w:
        for i in range(24):
            w.write({"__key__": f"k{i:03d}", "cls": str(i).encode()})
    return sorted(str(p) for p in d.glob("s-*.tar"))


def draw(sample):
    """An augmentation that draws from every generator a map= function may use."""
    sample["draws"] = (
        int(sf.sample_rng(sample).integers(1 << 40)),
        sf.sample_rng(sample, "python").getrandbits(40),
        int(np.random.randint(1 << 30)),
        random.getrandbits(40),
        int(torch.randint(1 << 40, (1,))),
    )
    return sample


def dataset(urls, seed=0, **kw):
    return sf.ShardDataset(urls, decode=None, map=draw, seed=seed, shuffle=8, manifest=False, **kw)


def by_key(items):
    """{key: draws} of samples or batches (batches: lists of samples, see the collate below)."""
    samples = [s for item in items for s in (item if isinstance(item, list) else [item])]
    return {s["__key__"]: s["draws"] for s in samples}


def run(urls, seed=0, epoch=0, workers=0, **kw):
    loader = sf.Loader(dataset(urls, seed, **kw), num_workers=workers)
    loader.set_epoch(epoch)
    return by_key(loader)


def test_the_same_run_draws_the_same(urls):
    first = run(urls)
    np.random.random(), random.random(), torch.rand(1)  # the process's generators have moved on
    assert run(urls) == first and len(first) == 24


def test_a_new_epoch_or_seed_draws_anew_for_every_sample(urls):
    base = run(urls)
    for other in (run(urls, epoch=1), run(urls, seed=1)):
        assert other.keys() == base.keys()
        # every generator of every sample: none repeats the epoch-0 / seed-0 draw
        assert all(a != b for k in base for a, b in zip(base[k], other[k]))


@pytest.mark.filterwarnings("ignore:2 ranks read shards without sample counts")  # counts are not the point
def test_every_rank_draws_what_one_rank_draws_for_its_samples(urls):
    ranks = [run(urls, epoch=2, rank=r, world_size=2) for r in (0, 1)]
    assert ranks[0].keys().isdisjoint(ranks[1]) and {**ranks[0], **ranks[1]} == run(urls, epoch=2)


def test_in_process_iteration_leaves_the_callers_generators_alone(urls):
    def callers_draws():
        return np.random.random(), random.random(), float(torch.rand(1))

    np.random.seed(3), random.seed(3), torch.manual_seed(3)
    expected = callers_draws()
    np.random.seed(3), random.seed(3), torch.manual_seed(3)
    ds = dataset(urls)
    assert len(list(ds)) == 24  # plain in-process iteration, map= reseeding per sample
    assert callers_draws() == expected


def test_workers_and_kept_workers_draw_what_one_process_draws(urls):
    in_process = [run(urls, epoch=e) for e in (0, 1)]
    loader = sf.Loader(dataset(urls), num_workers=2)  # persistent: epoch 1 runs in the same workers
    epochs = [by_key(loader), by_key(loader)]
    assert epochs == in_process


def test_resume_draws_what_the_uninterrupted_epoch_draws(urls):
    whole = run(urls, epoch=1, batch_size=4, collate=list)
    loader = sf.Loader(dataset(urls, batch_size=4, collate=list))
    loader.set_epoch(1)
    it = iter(loader)
    head = by_key([next(it), next(it)])
    state = loader.state_dict()
    del it
    resumed = sf.Loader(dataset(urls, batch_size=4, collate=list))
    resumed.load_state_dict(state)
    rest = by_key(resumed)
    assert head.keys().isdisjoint(rest) and {**head, **rest} == whole


def mixup(batch):
    """A user collate that draws (a batch-level augmentation)."""
    return {"__key__": [s["__key__"] for s in batch], "lam": float(np.random.beta(1, 1)),
            "perm": torch.randperm(len(batch)).tolist()}


def test_a_user_collate_is_seeded_per_batch(urls):
    def batches(seed, epoch):
        loader = sf.Loader(dataset(urls, seed, batch_size=4, collate=mixup))
        loader.set_epoch(epoch)
        return [(b["__key__"], b["lam"], b["perm"]) for b in loader]

    first = batches(0, 0)
    assert batches(0, 0) == first
    assert all(a[1] != b[1] for a, b in zip(first, batches(0, 1)))
    assert all(a[1] != b[1] for a, b in zip(first, batches(1, 0)))
