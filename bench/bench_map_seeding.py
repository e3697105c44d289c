"""What seeding map= per sample costs the training reader (reader/seeding.py), in one run:

  unseeded     map= called as before the seeding (the reader's map= stage alone)
  seeded       the global generators and sample_rng's seed set per sample (DataLoader workers: this)
  seeded+kept  also the caller's generator states put back around each item (in-process iteration)

In-process iteration of 4,000 tiny samples (decode=None, an identity map=, torch imported), so the
figures are the overhead itself, per sample, unbatched: the worst case for `kept`, which costs once
per item (a batch when batch_size is set). Variants run in rotated order, medians of --repeat.

    .venv/bin/python bench/bench_map_seeding.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch  # noqa: F401  (imported: its CPU generator is seeded and kept too)

import shardflow as sf
import shardflow.reader.dataset as dataset_module
import shardflow.reader.prepare as prepare_module
from shardflow.reader import seeding
from shardflow.shards.writer import ShardWriter


def _identity(sample: dict) -> dict:
    return sample


def _unseeded(fn, arg, *_):
    return fn(arg)


def _as_is(items):
    return items


VARIANTS = {
    "unseeded": (_unseeded, _as_is),
    "seeded": (seeding.call_seeded, _as_is),
    "seeded+kept": (seeding.call_seeded, seeding.keeping_global_rngs),
}


def per_sample_us(urls: list[str]) -> float:
    start = time.perf_counter()
    n = sum(1 for _ in sf.ShardDataset(urls, decode=None, map=_identity, shuffle=0, manifest=False))
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with ShardWriter(os.path.join(tmp, "s-%03d.tar"), maxcount=1000) as w:
            for i in range(args.samples):
                w.write({"__key__": f"k{i:06d}", "txt": b"x"})
        urls = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".tar"))
        names = list(VARIANTS)
        times: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(args.repeat):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                prepare_module.call_seeded, dataset_module.keeping_global_rngs = VARIANTS[name]
                times[name].append(per_sample_us(urls))
        prepare_module.call_seeded, dataset_module.keeping_global_rngs = VARIANTS["seeded+kept"]
    base = statistics.median(times["unseeded"])
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in names:
        median = statistics.median(times[name])
        print(f"{name:12s} {median:7.1f} us/sample  (+{median - base:.1f} us)")


if __name__ == "__main__":
    main()
