"""Ray backend benchmark: the augment job on the same 2 cores, side by side in one run (issue 25).

  processes       job.run("processes", workers=2): shardflow's local pool (the reference)
  ray             job.run("ray") on a local Ray of 2 CPUs started once before the first round (its
                  start is timed apart and reported alone; the backend joins the running Ray)
  raydata         Ray Data on the same Ray: read_webdataset -> map -> write_webdataset, its defaults
  raydata-blocks  the same with override_num_blocks=<number of input shards>

The job is jobs/augment.py with its settings (decode torchrgb, flip, noise, PNG level 1 written by
ISA-L, cls). The Ray Data rows run the same augment_image on the same torch CHW floats with the same
per-sample seeds, and encode the PNG with shardflow's Encoder at the same settings, so every row does
the same per-sample work: the differences are the engines'. Rounds rotate the order; medians of
--repeat rounds, and per round the ratio to "processes".

Then the per-task overhead: a no-op job over --tiny one-sample shards, CPU milliseconds per task of
every process (driver, workers, Ray's raylet and GCS) and wall milliseconds per task, processes vs
ray (automatic grouping of tiny tasks, and tasks_per_call=1: one Ray task each).

    .venv/bin/python bench/bench_ray.py                  # 8 shards x 48 images 512x384, 3 rounds
    .venv/bin/python bench/bench_ray.py --repeat 3 --tiny 200

For other benchmarks (bench/bench_augment_ray.py): `run_ray_data(inputs, outdir, blocks) -> samples/s`
and `ray_augment_runner(inputs, outdir, blocks)` run the Ray Data row on the Ray this process joined.
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
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # one thread per worker, every row
    os.environ.setdefault(_name, "1")

from bench_dask import Meter  # noqa: E402  (CPU of this process and all its descendants)

JOB_FILE = REPO / "jobs" / "augment.py"
WORKERS = 2


# -- Ray Data ------------------------------------------------------------------------------------------
class _AugmentRow:
    """The augment job on a Ray Data row: jpg decoded by Ray (HWC uint8) -> torch CHW float, the job's
    augment_image with the job's per-sample seed, PNG by shardflow's Encoder at the job's settings."""

    def __init__(self) -> None:
        from shardflow.codecs import Encoder
        from shardflow.job.jobfile import load_job_file

        loaded = load_job_file(str(JOB_FILE))
        self.module = loaded.module
        self.encoder = Encoder(**loaded.module.JOB["encode"])

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import torch

        import shardflow as sf

        params = self.module.PARAMS
        rng = sf.sample_rng({"__key__": row["__key__"]}, "torch")
        image = torch.from_numpy(np.ascontiguousarray(row["jpg"])).permute(2, 0, 1).float().div_(255.0)
        image = self.module.augment_image(image, rng, params["noise"], params["flip"], params["crop"])
        encoded = self.encoder({"__key__": row["__key__"], "png": image, "cls": int(row["json"]["label"])})
        return {"__key__": row["__key__"], "png": encoded["png"], "cls": encoded["cls"]}


_row: _AugmentRow | None = None


def _augment_row(row: dict[str, Any]) -> dict[str, Any]:
    global _row
    if _row is None:  # once per Ray worker process
        _row = _AugmentRow()
    return _row(row)


def ray_augment_runner(inputs: list[str], outdir: str | Path, blocks: int | None) -> None:
    """The augment job written with Ray Data: read_webdataset -> map -> write_webdataset (blocks: the
    override_num_blocks of the read, None for Ray's default). Needs ray.init() first."""
    import ray

    read = {"override_num_blocks": blocks} if blocks else {}
    # encoder=None: the row's values are the bytes shardflow's Encoder made (Ray's own would re-encode the
    # PNG at PIL's default level 6, and refuses bytes)
    ray.data.read_webdataset(list(inputs), **read).map(_augment_row).write_webdataset(str(outdir), encoder=None)


def run_ray_data(inputs: list[str], outdir: str | Path, blocks: int | None) -> float:
    """ray_augment_runner timed: samples/s (samples counted in what it wrote)."""
    started = time.perf_counter()
    ray_augment_runner(inputs, outdir, blocks)
    seconds = time.perf_counter() - started
    return _count_samples(Path(outdir)) / seconds


def _count_samples(outdir: Path) -> int:
    from shardflow.shards.samples import read_samples

    return sum(1 for path in sorted(outdir.rglob("*.tar")) for _ in read_samples(str(path)))


# -- shardflow rows ------------------------------------------------------------------------------------
def run_backend(backend: str, spec: str, outdir: Path, **options: Any) -> tuple[float, int]:
    from shardflow import load_job

    job = load_job(str(JOB_FILE), inputs=spec, outputs=str(outdir / "{name}.tar"))
    started = time.perf_counter()
    report = job.run(backend, progress=False, **options)
    seconds = time.perf_counter() - started
    assert report.ok, str(report)
    return seconds, report.stats.samples_in


def noop(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


def overhead(root: Path, tasks: int) -> list[tuple[str, float, float]]:
    """(row, CPU ms per task, wall ms per task) of a no-op job over `tasks` one-sample shards."""
    import shardflow as sf

    tiny = root / "tiny"
    tiny.mkdir(parents=True, exist_ok=True)
    for i in range(tasks):
        with sf.TarWriter(str(tiny / f"t-{i:06d}.tar")) as writer:
            writer.write({"__key__": f"k{i:06d}", "txt": b"x"})
    spec = str(tiny / f"t-{{000000..{tasks - 1:06d}}}.tar")
    rows = [("processes", "processes", {"workers": WORKERS}), ("ray (grouped)", "ray", {}),
            ("ray (1 per Ray task)", "ray", {"tasks_per_call": 1})]
    out: list[tuple[str, float, float]] = []
    for label, backend, options in rows:
        target = root / f"tiny-out-{backend}-{len(out)}"
        shutil.rmtree(target, ignore_errors=True)
        job = sf.ShardJob(noop, spec, str(target / "{name}.tar"))
        with Meter() as meter:
            report = job.run(backend, progress=False, **options)
        assert report.ok and report.done == tasks, str(report)
        out.append((label, meter.cpu / tasks * 1000, meter.wall / tasks * 1000))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiny", type=int, default=200, help="one-sample tasks of the overhead test (0: skip it)")
    ap.add_argument("--dir", help="scratch directory (kept; inputs reused)")
    args = ap.parse_args()

    import ray

    from shardflow.tools.demo import shard_name, shards_spec, write_synthetic_shards

    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-ray-"))
    inputs = [str(scratch / "in" / shard_name("train", i)) for i in range(args.shards)]
    if not all(os.path.exists(p) for p in inputs):  # kept from an earlier run with --dir
        write_synthetic_shards(scratch / "in", args.shards, args.per_shard)
    spec = shards_spec(scratch / "in", args.shards)
    total = args.shards * args.per_shard
    started = time.perf_counter()
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)  # our own Ray
    ray_start = time.perf_counter() - started
    ray.data.DataContext.get_current().enable_progress_bars = False
    print(f"{total} images ({args.shards} shards x {args.per_shard}, 512x384 JPEG -> augment -> PNG level 1), "
          f"{os.cpu_count()} cores, {WORKERS} workers; Ray start {ray_start:.1f} s (not in any row); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    variants: dict[str, Callable[[Path], float]] = {
        "processes": lambda out: run_backend("processes", spec, out, workers=WORKERS)[0],
        "ray": lambda out: run_backend("ray", spec, out)[0],
        "raydata": lambda out: total / run_ray_data(inputs, out, None),
        "raydata-blocks": lambda out: total / run_ray_data(inputs, out, args.shards),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    try:
        for round_ in range(args.repeat):
            for name in order[round_ % len(order):] + order[: round_ % len(order)]:
                out = scratch / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                seconds = variants[name](out)
                times[name].append(seconds)
                print(f"  round {round_ + 1} {name:15s} {total / seconds:6.1f} images/s ({seconds:.1f} s), "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
        print("\n| row | images/s (median) | x processes (median of rounds) | runs |\n|---|---:|---:|---|")
        for name, ts in times.items():
            ratio = statistics.median(times["processes"][i] / ts[i] for i in range(len(ts)))
            print(f"| {name} | {total / statistics.median(ts):.1f} | {ratio:.2f}x | "
                  f"{', '.join(f'{total / t:.1f}' for t in ts)} |")
        if args.tiny:
            print(f"\nper-task overhead, no-op job over {args.tiny} one-sample shards (warm Ray):")
            print("| row | CPU ms per task (all processes) | wall ms per task |\n|---|---:|---:|")
            for label, cpu_ms, wall_ms in overhead(scratch, args.tiny):
                print(f"| {label} | {cpu_ms:.1f} | {wall_ms:.1f} |")
        print(f"\nload after {os.getloadavg()[0]:.1f}")
    finally:
        ray.shutdown()
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
