"""Job benchmark: shardflow's augment job against the webdataset docs' recipe and a bare loop.

All variants read the same synthetic shards (512x384 photo-like JPEG + json label), run the same
augmentation (`augment_image` of jobs/augment.py: flip, Gaussian noise from sample_rng, clamp to
[0, 1]) and write the same format (png + cls):

(a) parallel, 2 workers:
    recipe     the webdataset docs' way: `wds.WebDataset(url).decode("torchrgb")` per shard, the
               function, `wds.TarWriter` per output shard, one `dask.delayed` per shard computed on a
               `distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True)` (cluster
               start-up NOT counted: the recipe is timed from compute() to the last shard written;
               the variables distributed sets for its workers, MALLOC_TRIM_THRESHOLD_ & co, stay
               theirs: this process's environment is put back after the cluster, see run_recipe)
    shardflow  `shardflow run jobs/augment.py --workers 2` (processes backend; worker start-up,
               plan and run directory counted)
(b) one process:
    loop       a hand-written loop: tarfile in, shardflow.codecs Decoder("torchrgb"), the function,
               Encoder(png level 1), tarfile out; nothing else
    serial     `shardflow run jobs/augment.py --backend serial` (plan, run directory, atomic commit,
               stats, error policy, per-sample seeding: the whole framework)

Run: python bench/bench_jobs.py [--shards 8] [--per-shard 64] [--repeat 2] [--only a|b]
The variants of (a), and of (b), run back to back, --repeat rounds. The table gives each variant's
best run, and the ratio to its baseline as the median over rounds of the ratio within a round (both
ran under the same load): the steadier figure on a shared machine. Besides wall-clock samples/s, the
CPU time per sample (all processes involved, from getrusage/psutil) is given. Every shardflow run
starts its worker processes from scratch (the fork server is stopped between runs), as a
`shardflow run` command does.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cpu_time import descendants_cpu, own_cpu  # noqa: E402

from shardflow import load_job  # noqa: E402
from shardflow.job.jobfile import load_job_file  # noqa: E402
from shardflow.tools.demo import shards_spec, write_synthetic_shards  # noqa: E402

JOB_FILE = REPO / "jobs" / "augment.py"


# -- (a) the webdataset docs' recipe ---------------------------------------------------------------
def recipe_shard(src: str, dst: str) -> int:
    """One shard the webdataset way: WebDataset(...).decode("torchrgb") -> function -> wds.TarWriter."""
    import webdataset as wds

    process = load_job_file(JOB_FILE).fn  # the very same function body as the shardflow job
    count = 0
    dataset = wds.WebDataset(src, shardshuffle=False, empty_check=False).decode("torchrgb")
    with wds.TarWriter(dst) as sink:
        for sample in dataset:
            out = process(sample)
            sink.write({"__key__": out["__key__"], "png": out["png"].permute(1, 2, 0).numpy(), "cls": out["cls"]})
            count += 1
    return count


def run_recipe(inputs: list[str], out: Path, workers: int) -> tuple[float, float, int]:
    """The recipe on a fresh LocalCluster. distributed writes its workers' variables into this process's
    os.environ (MALLOC_TRIM_THRESHOLD_=65536, OMP_NUM_THREADS=1, ...) and leaves them there: put back,
    or every variant run after it inherits them, which a `shardflow run` typed in a shell does not
    (MALLOC_TRIM_THRESHOLD_ turns off glibc's dynamic mmap threshold, so every large array is a fresh
    mmap: measured +3-4 ms CPU per sample for shardflow's augment)."""
    saved = dict(os.environ)
    try:
        return _recipe_on_cluster(inputs, out, workers)
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update(saved)


def _recipe_on_cluster(inputs: list[str], out: Path, workers: int) -> tuple[float, float, int]:
    import dask
    from distributed import Client, LocalCluster

    out.mkdir(parents=True, exist_ok=True)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        tasks = [dask.delayed(recipe_shard)(src, str(out / Path(src).name)) for src in inputs]
        cpu_before = sum(client.run(own_cpu).values()) + own_cpu()
        started = time.perf_counter()
        counts = dask.compute(*tasks)
        elapsed = time.perf_counter() - started
        cpu = sum(client.run(own_cpu).values()) + own_cpu() - cpu_before
        return elapsed, cpu, sum(counts)


def _stop_forkserver() -> None:
    """Stop the multiprocessing fork server (and reap it, so its CPU time is counted), so that every
    measured run starts its workers from scratch, as a `shardflow run` command does."""
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is not None:
        stop()


def run_shardflow(inputs_spec: str, out: Path, backend: str, workers: int | None) -> tuple[float, float, int]:
    job = load_job(JOB_FILE, inputs=inputs_spec, outputs=str(out / "{name}.tar"))
    _stop_forkserver()
    cpu_before = own_cpu() + descendants_cpu()
    started = time.perf_counter()
    report = job.run(backend, workers=workers) if workers else job.run(backend)
    elapsed = time.perf_counter() - started
    _stop_forkserver()
    cpu = own_cpu() + descendants_cpu() - cpu_before
    assert report.ok, str(report)
    return elapsed, cpu, report.stats.samples_out


# -- (b) a hand-written loop --------------------------------------------------------------------------
def run_loop(inputs: list[str], out: Path) -> tuple[float, float, int]:
    """Read with tarfile, decode/encode with shardflow.codecs, the same function, write with tarfile."""
    from shardflow import Decoder, Encoder

    process = load_job_file(JOB_FILE).fn
    decode, encode = Decoder("torchrgb"), Encoder(png_compress_level=1)
    out.mkdir(parents=True, exist_ok=True)
    cpu_before = own_cpu()
    started = time.perf_counter()
    count = 0
    for src in inputs:
        with tarfile.open(src) as tin, tarfile.open(out / Path(src).name, "w", format=tarfile.USTAR_FORMAT) as tout:
            sample: dict = {}
            members = iter(tin)

            def flush() -> int:
                if not sample:  # noqa: B023 - the sample being filled in this iteration, on purpose
                    return 0
                encoded = encode(process(decode(sample)))  # noqa: B023
                for ext in sorted(k for k in encoded if not k.startswith("__")):
                    info = tarfile.TarInfo(f"{encoded['__key__']}.{ext}")
                    info.size = len(encoded[ext])
                    tout.addfile(info, io.BytesIO(encoded[ext]))
                return 1

            for member in members:
                key, _, ext = member.name.partition(".")
                if sample and sample["__key__"] != key:
                    count += flush()
                    sample.clear()
                sample.setdefault("__key__", key)
                sample["__url__"] = src
                sample[ext] = tin.extractfile(member).read()
            count += flush()
    return time.perf_counter() - started, own_cpu() - cpu_before, count


# -- driver ---------------------------------------------------------------------------------------------
def interleaved(variants: dict, repeat: int, scratch: Path) -> dict[str, tuple[float, float, int]]:
    """{label: (best wall seconds, best CPU seconds, samples)}: the variants run in turn, `repeat`
    rounds, so that a change in the machine's load hits them alike."""
    results: dict[str, list] = {label: [] for label in variants}
    for attempt in range(repeat):
        for label, fn in variants.items():
            out = scratch / f"{label}-{attempt}"
            results[label].append(fn(out))
            written = sum(p.stat().st_size for p in out.glob("*.tar"))
            shutil.rmtree(out, ignore_errors=True)
            wall, cpu, count = results[label][-1]
            print(f"  {label:10} run {attempt + 1}: {count} samples in {wall:.2f} s ({count / wall:.1f} samples/s), "
                  f"{cpu:.2f} CPU s ({cpu / count * 1e3:.1f} ms CPU per sample), {written / 1e6:.0f} MB written, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    return {label: (min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2], runs)
            for label, runs in results.items()}


def round_ratios(ours: tuple, base: tuple) -> tuple[float, float]:
    """Median over rounds of (our samples/s / baseline samples/s) and of the CPU-per-sample ratio; each
    round ran both back to back, so the ratio of a round is steadier than best-of figures."""
    import statistics

    walls = [(o[2] / o[0]) / (b[2] / b[0]) for o, b in zip(ours[3], base[3])]
    cpus = [(b[1] / b[2]) / (o[1] / o[2]) for o, b in zip(ours[3], base[3])]
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=["a", "b"])
    parser.add_argument("--dir", help="scratch directory (default: a temp dir, removed after)")
    args = parser.parse_args()

    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    inputs = write_synthetic_shards(scratch / "in", args.shards, args.per_shard)
    spec = shards_spec(scratch / "in", args.shards)
    total = args.shards * args.per_shard
    print(f"{total} samples ({args.shards} shards x {args.per_shard}, 512x384 JPEG + json) on {os.cpu_count()} cores, "
          f"python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    try:
        if args.only in (None, "a"):
            print(f"(a) {args.workers} workers", flush=True)
            got = interleaved({"recipe": lambda out: run_recipe(inputs, out, args.workers),
                               "shardflow": lambda out: run_shardflow(spec, out, "processes", args.workers)},
                              args.repeat, scratch)
            recipe, ours = got["recipe"], got["shardflow"]
            rows.append(("(a) wds + dask recipe, 2 workers", recipe, None))
            rows.append(("(a) shardflow processes, 2 workers", ours, recipe))
        if args.only in (None, "b"):
            print("(b) one process (one torch thread: one worker is one core)", flush=True)
            import torch

            torch.set_num_threads(1)
            got = interleaved({"loop": lambda out: run_loop(inputs, out),
                               "serial": lambda out: run_shardflow(spec, out, "serial", None)}, args.repeat, scratch)
            loop, serial = got["loop"], got["serial"]
            rows.append(("(b) hand-written loop, 1 process", loop, None))
            rows.append(("(b) shardflow serial, 1 process", serial, loop))
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("| variant | samples/s (best) | CPU ms/sample (best) | vs baseline: samples/s (median of rounds) "
          "| CPU (median) |")
    print("|---|---:|---:|---:|---:|")
    for name, result, base in rows:
        wall, cpu, count, _ = result
        rate, per = count / wall, cpu / count * 1e3
        ratio = cpu_ratio = ""
        if base is not None:
            r_wall, r_cpu = round_ratios(result, base)
            ratio, cpu_ratio = f"{r_wall:.2f}x", f"{r_cpu:.2f}x"
        print(f"| {name} | {rate:.1f} | {per:.1f} | {ratio} | {cpu_ratio} |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f} (wall-clock figures are only meaningful on an idle machine;"
          " CPU time per sample is less sensitive to other load)")


if __name__ == "__main__":
    main()
