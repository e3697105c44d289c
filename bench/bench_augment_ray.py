"""The augment job vs Ray Data on the same two cores, one run (issue 28).

The job (jobs/augment.py at PNG level 6, the level Ray and webdataset write): decode the JPEG, flip,
Gaussian noise, clamp, encode PNG, write the label; --shards x --per-shard images 512x384.

  shardflow        `load_job("jobs/augment.py", --set encode.png_compress_level=6).run("processes",
                   workers=2)`: sha256 receipts, fsync + atomic rename, markers: every guarantee on;
                   the fork server is stopped before each run (a `shardflow run` starts it too), so
                   worker start and job unpickling are inside the clock
  ray-defaults     Ray Data `read_webdataset -> map -> write_webdataset` with its defaults
  ray-8-blocks     the same with `override_num_blocks=<shards>` (one task and one tar per input shard)

Ray runs on `ray.init(num_cpus=2)` started once, before the first round (its start, 18-28 s, is left
out of its clock; shardflow's start is in). The Ray rows run the job's `augment_image` on Ray's decoded
rows and let write_webdataset encode the PNG (Pillow, level 6: Ray's default). shardflow writes the
same PNG bytes as Pillow at level 6 (codecs/png.py: Pillow's row filters chosen in numpy, Pillow's zlib
settings; tests/codecs/test_png_levels.py compares them byte for byte). bench/bench_ray.py's runner
(issue 25) encodes with the job's own settings (PNG level 1 by ISA-L), the other comparison.
This file runs as __main__ so that cloudpickle ships `_ray_row` to Ray's workers by value.
Rounds rotate the order; the table gives
medians and the per-round ratio shardflow / best Ray row. `--profile` adds, per shardflow run, where
its processes spent the clock (bench/idle_profile.py: ran, waited for a core, blocked or idle).

    .venv/bin/python bench/bench_augment_ray.py --repeat 3
    .venv/bin/python bench/bench_augment_ray.py --only shardflow --profile --repeat 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cpu_time import descendants_cpu, own_cpu  # noqa: E402
from idle_profile import ProcessTree  # noqa: E402

JOB_FILE = REPO / "jobs" / "augment.py"
PNG_LEVEL = 6


def run_shardflow(spec: str, out: Path, workers: int = 2, profile: bool = False) -> tuple[float, str]:
    """One shardflow run from a stopped fork server; (seconds, idle table or "")."""
    from multiprocessing import forkserver

    from shardflow import load_job

    job = load_job(JOB_FILE, inputs=spec, outputs=str(out / "{name}.tar"),
                   overrides={"encode.png_compress_level": PNG_LEVEL})
    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is not None:
        stop()
    tree = ProcessTree() if profile else None
    if tree is not None:
        tree.__enter__()
    started = time.perf_counter()
    report = job.run("processes", workers=workers, progress=False)
    elapsed = time.perf_counter() - started
    if tree is not None:
        tree.__exit__(None, None, None)
    assert report.ok, str(report)
    return elapsed, tree.table() + "\n" + tree.deciles() if tree is not None else ""


# -- Ray Data -----------------------------------------------------------------------------------------
def _ray_row(row: dict[str, Any]) -> dict[str, Any]:
    """The job's function on a Ray Data row (jpg decoded by Ray to HWC uint8, json to a dict)."""
    import numpy as np
    import torch

    from shardflow.job.jobfile import load_job_file

    augment_image = load_job_file(JOB_FILE).module.augment_image
    key = row["__key__"]
    rng = torch.Generator().manual_seed(hash(key) & 0xFFFFFFFF)
    image = torch.from_numpy(np.ascontiguousarray(row["jpg"])).permute(2, 0, 1).float().div_(255.0)
    image = augment_image(image, rng)
    png = image.mul_(255.0).round_().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    return {"__key__": key, "png": png, "cls": int(row["json"]["label"])}


def _own_ray_runner(inputs: list[str], out: Path, blocks: int | None) -> None:
    import ray

    read = {"override_num_blocks": blocks} if blocks else {}
    ray.data.read_webdataset(inputs, **read).map(_ray_row).write_webdataset(str(out))


def run_ray(inputs: list[str], out: Path, blocks: int | None) -> tuple[float, str]:
    started = time.perf_counter()
    _own_ray_runner(inputs, out, blocks)
    return time.perf_counter() - started, ""


def tree_cpu() -> float:
    """CPU seconds of this process and every descendant (the fork server and workers; Ray's GCS, raylet
    and workers), their reaped children included: the CPU a row cost is the difference around it."""
    return own_cpu() + descendants_cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["shardflow", "ray"])
    ap.add_argument("--profile", action="store_true", help="per-process ran / waited / blocked table per run")
    ap.add_argument("--dir", help="scratch directory (kept; inputs reused)")
    args = ap.parse_args()

    from shardflow.tools.demo import shard_name, shards_spec, write_synthetic_shards

    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-augment-ray-"))
    inputs = [str(scratch / "in" / shard_name("train", i)) for i in range(args.shards)]
    if not all(os.path.exists(p) for p in inputs):  # kept from an earlier run with --dir
        write_synthetic_shards(scratch / "in", args.shards, args.per_shard)
    spec = shards_spec(scratch / "in", args.shards)
    total = args.shards * args.per_shard
    variants: dict[str, Callable[[Path], tuple[float, str]]] = {}
    if args.only in (None, "shardflow"):
        variants["shardflow"] = lambda out: run_shardflow(spec, out, profile=args.profile)
    if args.only in (None, "ray"):
        import ray

        # a cluster of our own ("local"), not one another process started on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        variants["ray-defaults"] = lambda out: run_ray(inputs, out, None)
        variants["ray-8-blocks"] = lambda out: run_ray(inputs, out, args.shards)
    print(f"{total} images ({args.shards} shards x {args.per_shard}, 512x384 JPEG -> PNG level {PNG_LEVEL}), "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    names_ = list(variants)
    try:
        for round_ in range(args.repeat):
            order = names_[round_ % len(names_):] + names_[:round_ % len(names_)]
            for name in order:
                out = scratch / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                cpu_before = tree_cpu()
                seconds, table = variants[name](out)
                cpus[name].append(tree_cpu() - cpu_before)
                times[name].append(seconds)
                print(f"  round {round_ + 1} {name:13s} {total / seconds:6.1f} images/s ({seconds:.1f} s), "
                      f"{cpus[name][-1] / total * 1e3:.1f} CPU ms/image, load {os.getloadavg()[0]:.1f}", flush=True)
                if table:
                    print(table, flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    print("\n| row | images/s (median) | runs | CPU ms/image (median, all processes) |\n|---|---:|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {total / statistics.median(ts):.1f} | {', '.join(f'{total / t:.1f}' for t in ts)} | "
              f"{statistics.median(cpus[name]) / total * 1e3:.1f} |")
    rays = [n for n in times if n.startswith("ray")]
    if "shardflow" in times and rays:
        per_round = [min(times[r][i] for r in rays) / times["shardflow"][i] for i in range(args.repeat)]
        print(f"\nshardflow / best Ray row per round: {', '.join(f'{r:.2f}x' for r in per_round)} "
              f"(median {statistics.median(per_round):.2f}x); load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
