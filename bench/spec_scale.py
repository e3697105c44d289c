"""Dataset specs at scale (issue 28 item 7): constructing a ShardDataset over a spec of C collections
that share one folder of N shards and its summary.json, and drawing the next collection without counts.

  construct   ShardDataset(spec) for C = 1, 10, 100, 1000 collections over N shards in one folder
              (a summary.json of N entries in the run directory a job leaves): wall and CPU seconds,
              median of --reps, sizes in rotated order
  draw        one weighted draw among C = 1000 collections, as MixSource._drawn does it: the old way
              (rng.choices with the active weights rebuilt per draw) and the new one (cumulative
              weights kept until a collection runs out), in the same run: microseconds per draw

Run: .venv/bin/python bench/spec_scale.py [--shards 100000] [--collections 1,10,100,1000] [--reps 3]
The machine is shared: compare the growth with C and the draw ratio within one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import tempfile
import time

from shardflow.rundir.layout import summary_beside


def write_folder(folder: str, n: int) -> None:
    """A summary.json of n shards `in-000000.tar ...` as a job's run directory leaves it (the shards
    themselves are not read while a dataset is constructed)."""
    path = summary_beside(folder)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    entries = [{"url": os.path.join(folder, f"in-{i:06d}.tar"), "nsamples": 10, "nbytes": 10240,
                "sha256": "0" * 64} for i in range(n)]
    with open(path, "w") as f:
        json.dump({"shards": entries}, f)


def spec_of(folder: str, n: int, collections: int) -> dict:
    per = n // collections
    return {"dataset": [{"shards": os.path.join(folder, f"in-{{{c * per:06d}..{(c + 1) * per - 1:06d}}}.tar"),
                         "weight": 1 + c % 3} for c in range(collections)]}


def construct(folder: str, n: int, collections: int) -> tuple[float, float]:
    from shardflow import ShardDataset

    spec = spec_of(folder, n, collections)
    wall, cpu = time.perf_counter(), time.process_time()
    ds = ShardDataset(spec, decode=None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert ds.nsamples == 10 * (n // collections) * collections
    return wall, cpu


def draws(collections: int, k: int = 200_000) -> dict[str, float]:
    weights = [1.0 + c % 3 for c in range(collections)]
    active = list(range(collections))
    out = {}
    for name in ("old", "new"):
        rng = random.Random(0)
        start = time.perf_counter()
        if name == "old":
            picks = [rng.choices(active, [weights[j] for j in active])[0] for _ in range(k)]
        else:
            cumulative = list(itertools.accumulate(weights))
            picks = [rng.choices(active, cum_weights=cumulative)[0] for _ in range(k)]
        out[name] = (time.perf_counter() - start) / k * 1e6
        out[f"{name}_first"] = picks[0]
    assert out["old_first"] == out["new_first"]  # the same draws
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--collections", default="1,10,100,1000")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(c) for c in args.collections.split(",")]
    print(f"# load: {os.getloadavg()[0]:.2f}  shards: {args.shards:,}")
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(tmp, args.shards)
        results: dict[int, list[tuple[float, float]]] = {c: [] for c in sizes}
        for rep in range(args.reps):
            for c in sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]:  # rotated order
                results[c].append(construct(tmp, args.shards, c))
    print("| collections | construct wall s (median) | CPU s (median) |")
    print("|---:|---:|---:|")
    for c in sizes:
        print(f"| {c:,} | {statistics.median(w for w, _ in results[c]):.2f} | "
              f"{statistics.median(u for _, u in results[c]):.2f} |")
    d = draws(1000)
    print(f"\ndraw among 1,000 collections: old {d['old']:.1f} us, new {d['new']:.1f} us "
          f"({d['old'] / d['new']:.0f}x), same draws")


if __name__ == "__main__":
    main()
