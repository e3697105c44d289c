"""Training on several ranks over shards shardflow did not write (issue 29 item 4), run as a user runs it:
torchrun with 2 ranks over gloo, 5 uneven plain-tar shards (10/30/7/50/3 samples, written by Python's
tarfile). Without a manifest the ranks get different counts and the reader says so (the hang it
prevents is DDP's all_reduce after the short rank's last batch); after `shardflow index` with
equalize="drop" every rank gets 50 samples and a collective per sample ends cleanly."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

COUNTS = (10, 30, 7, 50, 3)

SCRIPT = '''
import datetime, json, sys, warnings
import torch, torch.distributed as dist
import shardflow as sf

mode, spec = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ds = sf.ShardDataset(spec, decode=None, equalize="drop" if mode == "index" else None)
    n = 0
    for sample in ds:
        n += 1
        if mode == "index":  # as DDP does per step: every rank must take part
            dist.all_reduce(torch.ones(1))
total = torch.tensor([n])
if mode == "index":
    dist.all_reduce(total)
with open(f"{mode}-{dist.get_rank()}.json", "w") as f:  # one file per rank: their stdout interleaves
    json.dump({"rank": dist.get_rank(), "n": n, "total": int(total), "warned": any(
        "ranks read shards without sample counts" in str(w.message) for w in caught)}, f)
dist.destroy_process_group()
'''


def _plain_tar_shards(folder: Path) -> str:
    for i, n in enumerate(COUNTS):
        with tarfile.open(folder / f"s-{i}.tar", "w") as tar:
            for k in range(n):
                for ext, data in (("txt", f"{i}-{k}".encode()), ("cls", str(k % 3).encode())):
                    info = tarfile.TarInfo(f"{i:02d}{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(folder / "s-{0..4}.tar")


def _torchrun(script: Path, mode: str, spec: str, tmp: Path) -> list[dict]:
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
         mode, spec], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((tmp / f"{mode}-{rank}.json").read_text()) for rank in (0, 1)]


def test_two_ranks_over_uneven_foreign_shards(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = _plain_tar_shards(data)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    plain = _torchrun(script, "plain", spec, tmp_path)
    assert [r["warned"] for r in plain] == [True, True]  # said before the epoch, on every rank
    assert sum(r["n"] for r in plain) == sum(COUNTS) and plain[0]["n"] != plain[1]["n"]  # what would hang

    index = subprocess.run([sys.executable, "-m", "shardflow", "index", spec, "-p", "1"], capture_output=True,
                           text=True, timeout=300)
    assert index.returncode == 0, index.stderr
    manifest = json.loads((data / "_shardflow" / "summary.json").read_text())
    assert [e["nsamples"] for e in manifest["shards"]] == list(COUNTS)

    indexed = _torchrun(script, "index", spec, tmp_path)
    assert [(r["n"], r["total"], r["warned"]) for r in indexed] == [(50, 100, False), (50, 100, False)]
