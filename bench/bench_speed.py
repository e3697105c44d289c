"""Whole-job passthrough speed: ShardJob (defaults) vs webdataset, Python's tarfile and `cat`, one run.

Issue 16 measured shardflow's passthrough of large samples (10 MB) as the slowest of the three tar
tools; this bench reproduces that comparison side by side, interleaved (a new, seeded order each round),
best and median of --repeat (CPU time: median, all processes involved):

  shardflow      ShardJob(identity).run() with its defaults: processes backend, sha256 receipts,
                 fsync + atomic rename, run directory with markers (CPU counts the pool's workers,
                 reaped by the fork server; the fork server starts once, in the first round)
  shardflow serial  the same job in this process (its CPU time is counted)
  webdataset     wds.tarfile_to_samples -> wds.TarWriter(encoder=False) (no checksum, no fsync)
  tarfile        tarfile.open("r|") -> tarfile.open("w") addfile(member, extractfile) copy
  cat            `cat in > out` (the raw copy limit: no parsing at all)
  cat + fsync    the same with the durability shardflow gives by default

    python bench/bench_speed.py --sample-mb 10 --total-mb 1000 --repeat 3
    python bench/bench_speed.py --sample-mb 0.06 --total-mb 500 --repeat 3

Inputs are in the page cache (read once before timing); outputs go to --tmp (default: system temp).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
from cpu_time import descendants_cpu, own_cpu  # noqa: E402

import shardflow as sf  # noqa: E402
from shardflow.shards.writer import TarWriter  # noqa: E402


def identity(sample):
    return sample


def make_shard(path: str, sample_bytes: int, total_bytes: int) -> int:
    rng = np.random.default_rng(0)
    n = max(1, total_bytes // sample_bytes)
    with TarWriter(path) as w:
        for i in range(n):
            size = int(sample_bytes * rng.uniform(0.7, 1.3))
            w.write({"__key__": f"s{i:07d}", "bin": rng.bytes(size), "cls": b"%d" % (i % 10)})
    return n


def run_shardflow(src: str, out: str) -> None:
    sf.ShardJob(identity, inputs=src, outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run")).run(progress=False)


def run_shardflow_serial(src: str, out: str) -> None:  # in this process: its CPU time is counted
    sf.ShardJob(identity, inputs=src, outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run")).run("serial", progress=False)


def run_webdataset(src: str, out: str) -> None:
    import webdataset as wds

    with wds.TarWriter(os.path.join(out, "o.tar"), encoder=False) as w:
        for sample in wds.tarfile_to_samples()([{"url": src}]):
            w.write({k: v for k, v in sample.items() if k != "__url__"})


def run_tarfile(src: str, out: str) -> None:
    with tarfile.open(src, "r|") as tin, tarfile.open(os.path.join(out, "o.tar"), "w") as tout:
        for member in tin:
            tout.addfile(member, tin.extractfile(member))


def run_cat(src: str, out: str, fsync: bool = False) -> None:
    with open(os.path.join(out, "o.tar"), "wb") as dst:
        subprocess.run(["cat", src], stdout=dst, check=True)
        if fsync:
            os.fsync(dst.fileno())


METHODS = {
    "shardflow": run_shardflow,
    "shardflow serial": run_shardflow_serial,
    "webdataset": run_webdataset,
    "tarfile": run_tarfile,
    "cat": run_cat,
    "cat + fsync": lambda src, out: run_cat(src, out, fsync=True),
}


def cpu() -> float:
    """CPU of this process and of every process it started (cat, the fork server and its workers)."""
    return own_cpu() + descendants_cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample-mb", type=float, default=10)
    ap.add_argument("--total-mb", type=float, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sf-speed-", dir=args.tmp)
    try:
        src = os.path.join(root, "in.tar")
        n = make_shard(src, int(args.sample_mb * 1e6), int(args.total_mb * 1e6))
        size = os.path.getsize(src)
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
        methods = args.methods.split(",")
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
        for round_ in range(args.repeat):
            # a new order every round (seeded): on this shared machine a run's CPU time swings up to
            # 1.7x with what ran just before it (deleting and fsyncing 1 GB leaves kernel work behind);
            # a fixed (or rotated) order charged that to the same method every round
            order = list(methods)
            random.Random(round_).shuffle(order)
            for name in order:
                out = os.path.join(root, "out")
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                subprocess.run(["sync"], check=True)
                c0, t0 = cpu(), time.perf_counter()
                METHODS[name](src, out)
                times[name].append((time.perf_counter() - t0, cpu() - c0))
        print(f"{n} samples of ~{args.sample_mb:g} MB, {size / 1e6:.0f} MB; best / median of {args.repeat}; "
              f"load {os.getloadavg()[0]:.1f}")
        best = {m: size / min(t for t, _ in ts) / 1e6 for m, ts in times.items()}
        for name, ts in times.items():
            med = statistics.median(t for t, _ in ts)
            cpu_s = statistics.median(c for _, c in ts)
            ratios = "  ".join(f"{best[name] / best[o]:.2f}x {o}" for o in methods if o != name)
            print(f"  {name:17s} {best[name]:6.0f} MB/s best {size / med / 1e6:6.0f} median  cpu {cpu_s:5.2f}s"
                  f"  {ratios}")
        cpu_med = {m: statistics.median(c for _, c in ts) for m, ts in times.items()}
        for name in (m for m in methods if m.startswith("shardflow")):
            ratios = "  ".join(f"{cpu_med[o] / cpu_med[name]:.2f}x {o}" for o in methods if o != name)
            print(f"  by CPU time (theirs / ours): {name:17s} {ratios}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
