"""Splitting by rank and DataLoader worker, end to end.

Each simulated rank is its own process (RANK / WORLD_SIZE in its environment, as torchrun sets
them) that iterates real DataLoader worker processes and prints the keys it got as JSON. The union
over all ranks must be the dataset's keys, each exactly once, in every epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.reader.test_dataset_loader import write_shards  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

RANK_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("always")
import torch
from shardflow import ShardDataset, Loader

runs = json.loads(sys.argv[1])
out = []
for run in runs:
    ds = ShardDataset(run["spec"], decode="torchrgb8", **run["kw"])
    try:
        length = len(ds)
    except TypeError:
        length = None
    epochs = []
    for epoch in run["epochs"]:
        ds.set_epoch(epoch)
        if run["loader"]:
            it = Loader(ds, num_workers=run["workers"])
        else:
            it = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=run["workers"])
        items = list(it)
        keys = []
        for item in items:
            k = item["__key__"]
            keys.extend(k if isinstance(k, list) else [k])
        epochs.append({"keys": keys, "items": len(items)})
    out.append({"len": length, "epochs": epochs})
print("RESULT " + json.dumps(out))
"""


def run_ranks(world: int, runs: list[dict], seed_env: str = "0") -> list[list[dict]]:
    """Start one process per rank; returns per rank the list of run results."""
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "PYTHONHASHSEED": seed_env,
               "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        env.pop("LOCAL_RANK", None)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, json.dumps(runs)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, f"rank {rank} failed:\n{stderr[-3000:]}"
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        results.append((json.loads(line[len("RESULT "):]), stderr))
    return results


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    six = write_shards(root / "six", [7, 11, 5, 9, 13, 3])
    shutil.copytree(root / "six", root / "six-u", ignore=shutil.ignore_patterns("_shardflow"))
    two = write_shards(root / "two", [20, 17])
    shutil.copytree(root / "two", root / "two-u", ignore=shutil.ignore_patterns("_shardflow"))
    return {
        "six": (str(root / "six" / "s-{000..005}.tar"), six),
        "six-u": (str(root / "six-u" / "s-{000..005}.tar"), six),
        "two": (str(root / "two" / "s-{000..001}.tar"), two),
        "two-u": (str(root / "two-u" / "s-{000..001}.tar"), two),
    }


def matrix_runs(datasets):
    runs, meta = [], []
    for name in ("six", "six-u", "two", "two-u"):
        spec, keys = datasets[name]
        for workers in (0, 1, 3):
            for shuffle, batch in ((0, None), (6, 4)):
                runs.append({"spec": spec, "workers": workers, "epochs": [0, 1], "loader": name.endswith("-u"),
                             "kw": {"shuffle": shuffle, "batch_size": batch, "seed": 3}})
                meta.append((name, workers, shuffle, batch, keys))
    return runs, meta


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_exactly_once_across_ranks_and_workers(datasets, world):
    runs, meta = matrix_runs(datasets)
    results = run_ranks(world, runs)
    for i, (name, workers, shuffle, batch, keys) in enumerate(meta):
        for e in range(2):
            per_rank = [res[i]["epochs"][e]["keys"] for res, _ in results]
            union = [k for keys_ in per_rank for k in keys_]
            assert sorted(union) == sorted(keys), (name, workers, shuffle, batch, e)
            if not name.endswith("-u"):  # counts known: len() is what each rank gets
                for res, _ in results:
                    assert res[i]["len"] == res[i]["epochs"][e]["items"], (name, workers, e)
                sizes = [len(k) for k in per_rank]
                assert max(sizes) - min(sizes) <= 1  # contiguous ranges: balanced ranks
            else:
                assert all(res[i]["len"] is None for res, _ in results)
        if shuffle:
            orders = [res[i]["epochs"][e]["keys"] for res, _ in results for e in range(2)]
            assert orders[0] != orders[1], (name, workers)  # epoch 0 vs 1 on rank 0
    # fewer shards than readers: shards are split inside, and a warning says so
    for _, stderr in results:
        assert f"2 shards for {world * 3} readers ({world} ranks x 3 workers): splitting inside shards" in stderr
        if world > 2:
            assert f"2 shards for {world} readers" in stderr


@pytest.mark.slow
def test_two_shards_six_consumers_and_reruns_are_identical(datasets):
    """2 shards for 2 ranks x 3 workers; with a shuffle, a rerun (new processes, another hash salt)
    gives the very same order on every rank, and another seed a different one."""
    runs = [{"spec": datasets[name][0], "workers": 3, "epochs": [0], "loader": True,
             "kw": {"shuffle": 10, "batch_size": 3, "seed": s}} for name in ("two", "two-u") for s in (5, 6)]
    first = run_ranks(2, runs, seed_env="1")
    again = run_ranks(2, runs, seed_env="2")
    for _, stderr in first:  # said once per process, not per worker or epoch
        assert stderr.count("2 shards for 6 readers (2 ranks x 3 workers): splitting inside shards") == 1
    for i, _run in enumerate(runs):
        got = [first[rank][0][i]["epochs"][0]["keys"] for rank in range(2)]
        assert got == [again[rank][0][i]["epochs"][0]["keys"] for rank in range(2)]
        assert sorted(got[0] + got[1]) == sorted(datasets["two"][1])
        assert got[0] and got[1]
    for i in (0, 2):  # seed 5 vs seed 6
        assert first[0][0][i]["epochs"][0]["keys"] != first[0][0][i + 1]["epochs"][0]["keys"]


DIST_SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
from shardflow import ShardDataset, Loader

rank, world, port, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
ds = ShardDataset(spec, decode="torchrgb8", batch_size=4, shuffle=8, seed=9, equalize="drop")
loader = Loader(ds, num_workers=2)
keys, batches = [], 0
for batch in loader:
    keys += batch["__key__"]
    batches += 1
    counted = torch.tensor([1])
    dist.all_reduce(counted)  # a DDP step: every rank must get here the same number of times
n = torch.tensor([batches])
dist.all_reduce(n, op=dist.ReduceOp.MAX)
print("RESULT " + json.dumps({"keys": keys, "batches": batches, "max_batches": int(n), "len": len(ds)}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torch_distributed_rank_and_equalize(datasets):
    """With torch.distributed initialised (gloo, no RANK/WORLD_SIZE in the environment) the split
    follows dist.get_rank(), and equalize='drop' keeps a DDP-style loop from hanging."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec, keys = datasets["six"]
    world = 2
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    procs = [subprocess.Popen([sys.executable, "-c", DIST_SCRIPT, str(r), str(world), str(port), spec], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"rank {r}:\n{err[-3000:]}"
        results.append(json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:]))
    got = [k for res in results for k in res["keys"]]
    assert len(got) == len(set(got)) == (len(keys) // world) * world
    assert set(got) <= set(keys)
    assert {res["batches"] for res in results} == {results[0]["max_batches"]} == {results[0]["len"]}
