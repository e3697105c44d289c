"""ShardDataset over a dataset spec: weighted mixing, exact epoch lengths over ranks and workers,
resume mid-epoch, and ShardJob / `shardflow stats` taking the same spec."""

from __future__ import annotations

import collections
import itertools
import json
import math

import pytest
import torch

import shardflow as sf
from shardflow.reader.mix import apportion
from shardflow.shards.record_write import RecordWriter
from shardflow.shards.writer import TarWriter


def _collection(folder, name, nshards, per_shard, *, summary=True, suffix=".tar"):
    """Shards of tiny samples keyed `name/shard/i`; a summary.json beside them gives the counts."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for s in range(nshards):
        url = str(folder / f"{name}-{s}{suffix}")
        writer = TarWriter(url) if suffix == ".tar" else RecordWriter(url)
        with writer as w:
            for i in range(per_shard):
                w.write({"__key__": f"{name}/{s}/{i:04d}", "txt": name.encode(), "cls": str(i).encode()})
        entries.append({"url": url, "nsamples": per_shard})
    if summary:
        (folder / "_shardflow").mkdir(exist_ok=True)
        (folder / "_shardflow" / "summary.json").write_text(json.dumps({"shards": entries}))
    return str(folder / f"{name}-{{0..{nshards - 1}}}{suffix}")


def _name(sample):
    return sample["__key__"].split("/", 1)[0]


@pytest.fixture(scope="module")
def colls(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return {
        "a": _collection(root / "a", "a", 3, 40),
        "b": _collection(root / "b", "b", 2, 25, suffix=".cbors"),
        "c": _collection(root / "c", "c", 4, 10, summary=False),
        "root": root,
    }


def test_apportion_is_exact():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(100000, [0.2, 0.3, 0.5]) == [20000, 30000, 50000]
    assert sum(apportion(99999, [0.3, 0.7, 1e-3])) == 99999


@pytest.mark.slow
def test_weighted_mixing_over_100k_samples(colls, tmp_path):
    spec = {"dataset": [{"shards": colls["a"], "weight": 0.2}, {"shards": colls["b"], "weight": 0.3},
                        {"shards": colls["c"], "weight": 0.5}], "epoch": 100_000}
    ds = sf.ShardDataset(spec, decode=None, seed=7)
    assert len(ds) == 100_000
    names = [_name(s) for s in ds]
    assert collections.Counter(names) == {"a": 20_000, "b": 30_000, "c": 50_000}  # exact quotas
    # well mixed: in every window of 5,000 each share is within 5 sigma of its weight
    for start in range(0, 100_000, 5_000):
        window = collections.Counter(names[start:start + 5_000])
        for name, p in (("a", 0.2), ("b", 0.3), ("c", 0.5)):
            assert abs(window[name] - 5_000 * p) < 5 * math.sqrt(5_000 * p * (1 - p)), (start, name, window)
    ds.set_epoch(0)
    assert [_name(s) for s in itertools.islice(ds, 10_000)] == names[:10_000]  # repeatable
    again = sf.ShardDataset(spec, decode=None, seed=8)
    assert [_name(s) for s in again][:200] != names[:200]  # the seed decides


def test_repeat_extensions_rename_and_counts(colls, tmp_path):
    spec = tmp_path / "train.yaml"
    spec.write_text(f"dataset:\n  - shards: {colls['a']}\n    repeat: 2\n    extensions: txt\n"
                    f"  - shards: {colls['b']}\n    rename: {{txt: text}}\n")
    ds = sf.ShardDataset(str(spec), decode=None)
    assert len(ds) == 2 * 120 + 50
    got = list(ds)
    count = collections.Counter(_name(s) for s in got)
    assert count == {"a": 240, "b": 50}
    a = [s for s in got if _name(s) == "a"]
    assert set(a[0]) == {"__key__", "__url__", "txt"}
    assert collections.Counter(s["__key__"] for s in a) == {k: 2 for k in {s["__key__"] for s in a}}
    b = next(s for s in got if _name(s) == "b")
    assert b["text"] == b"b" and "txt" not in b


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exact_epoch_length_over_ranks_and_workers(colls, world, workers):
    spec = {"dataset": [{"shards": colls["a"], "weight": 2}, {"shards": colls["b"], "weight": 1},
                        {"shards": colls["c"]}], "epoch": 1000}
    quotas = apportion(1000, [2, 1, 1])
    every = collections.Counter()
    for rank in range(world):
        ds = sf.ShardDataset(spec, decode=None, rank=rank, world_size=world, batch_size=7, seed=3)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        batches = list(loader)
        assert len(batches) == len(ds) == math.ceil(sum(q // world for q in quotas) / 7)
        for b in batches:
            every.update(k.split("/", 1)[0] for k in b["__key__"])
    assert every == {n: world * (q // world) for n, q in zip("abc", quotas)}


def test_counts_known_epoch_is_exact_without_an_epoch(colls):
    spec = {"dataset": [{"shards": colls["a"]}, {"shards": colls["b"]}]}  # 120 + 50 samples, no epoch
    for world in (1, 2, 3):
        seen = []
        for rank in range(world):
            ds = sf.ShardDataset(spec, decode=None, rank=rank, world_size=world)
            got = [s["__key__"] for s in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
            assert len(got) == len(ds)
            seen += got
        assert len(seen) == len(set(seen)) == world * (120 // world) + world * (50 // world)


def test_resume_mid_epoch_of_a_mixed_spec(colls):
    spec = {"dataset": [{"shards": colls["a"], "weight": 0.6}, {"shards": colls["c"], "weight": 0.4}],
            "epoch": 300}

    def make():
        return sf.ShardDataset(spec, decode=None, shuffle=20, seed=5, batch_size=4)

    full = [k for b in sf.Loader(make(), num_workers=2) for k in b["__key__"]]
    loader = sf.Loader(make(), num_workers=2)
    it = iter(loader)
    seen = [k for _ in range(9) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = sf.Loader(make(), num_workers=2)
    resumed.load_state_dict(state)
    rest = [k for b in resumed for k in b["__key__"]]
    assert sorted(seen + rest) == sorted(full) and len(seen) == 36
    # in process too, and a state of another mix is refused
    ds = make()
    it = iter(ds)
    first = [k for _ in range(5) for k in next(it)["__key__"]]
    state = ds.state_dict()
    it.close()
    again = make()
    again.load_state_dict(state)
    assert first + [k for b in again for k in b["__key__"]] == [k for b in make() for k in b["__key__"]]
    other = sf.ShardDataset({**spec, "epoch": 301}, decode=None, shuffle=20, seed=5, batch_size=4)
    with pytest.raises(ValueError, match="different list of shards"):
        other.load_state_dict(state)


def test_unknown_counts_without_epoch_mix_by_weight(colls):
    spec = {"dataset": [{"shards": colls["c"], "weight": 1}, {"shards": colls["c"].replace("c-", "c-"), "weight": 3}]}
    ds = sf.ShardDataset(spec, decode=None)
    with pytest.raises(TypeError, match="no 'epoch:'"):
        len(ds)
    assert len(list(ds)) == 80


def test_job_takes_a_spec_with_views(colls, tmp_path):
    spec = tmp_path / "train.yaml"
    spec.write_text(f"dataset:\n  - shards: {colls['a']}\n    weight: 3\n    extensions: txt\n"
                    f"    rename: {{txt: text}}\n  - shards: {colls['b']}\n")
    seen = []

    def keep(sample):
        seen.append(sorted(k for k in sample if not k.startswith("__")))
        return sample

    job = sf.ShardJob(keep, inputs=str(spec), outputs=str(tmp_path / "out" / "{name}.tar"))
    assert len(job.plan()) == 3 + 2  # every shard of every collection is a task; weights do not apply
    report = job.run("serial")
    assert report.done == 5 and not report.failed
    a = list(sf.read_samples(str(tmp_path / "out" / "a-0.tar")))
    assert len(a) == 40 and set(a[0]) == {"__key__", "__url__", "text"}
    b = list(sf.read_samples(str(tmp_path / "out" / "b-0.tar")))
    assert set(b[0]) == {"__key__", "__url__", "txt", "cls"}


def test_stats_reports_per_collection(colls, tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "train.yaml"
    spec.write_text(f"dataset:\n  - shards: {colls['a']}\n  - shards: {colls['b']}\n")
    res = subprocess.run([sys.executable, "-m", "shardflow.cli", "stats", "--json", str(spec)],
                         capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    assert out["samples"] == 170 and [c["samples"] for c in out["collections"]] == [120, 50]
    assert "train.yaml, line 2" in out["collections"][0]["name"]
    res = subprocess.run([sys.executable, "-m", "shardflow.cli", "stats", str(spec)],
                         capture_output=True, text=True, check=True)
    assert res.stdout.count("collection ") == 2 and "total\nshards        5" in res.stdout
