"""Dask backend benchmark: the same job on the same shards, three ways, in one run.

  processes   job.run("processes", workers=W)                     shardflow's local process pool
  dask        job.run("dask", client=...) on a LocalCluster of W worker processes x 1 thread,
              started before the clock and kept across runs (a cluster outlives its jobs), with
              the settings of the one the backend starts (its workers' profiler off)
  dask+start  job.run("dask", workers=W): the backend starts its own LocalCluster; its start and
              stop are timed too (cold workers)
  recipe      the webdataset docs' way on the same cluster as "dask": one dask.delayed per shard
              around a webdataset loop (WebDataset(url).decode("torchrgb") -> the same function ->
              wds.TarWriter, its default encoders), dask.compute(*all_shards)

The job is jobs/augment.py (decode torchrgb, flip, noise, PNG level 1 + cls). The first run of each
variant pays the imports (torch...) in its workers; later runs of "processes" fork from its warm
forkserver and "dask"/"recipe" reuse the warm cluster. Reported: samples/s over the whole run (best
of --repeat), the ratio to the processes backend, and the CPU time of all processes per sample.

Then the scheduler overhead per task: a no-op job over `--tiny` one-sample shards, wall time /
tasks, processes vs dask (a warm LocalCluster), W workers each.

Each variant runs `--repeat` times, alternating, and the best run of each is kept (the machine may
be shared). Outputs are checked: dask writes the same bytes as processes. Every worker process of
every variant computes on one thread (OMP_NUM_THREADS=1, as Dask's nanny sets it for its workers).

    python bench/bench_dask.py                         # 16 shards x 48 images 512x384, 2 workers
    python bench/bench_dask.py --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
# One compute thread per worker process in every variant: Dask's nanny sets these for its workers,
# and the processes backend's workers inherit them from here, so each variant runs W threads on W
# cores (left to torch's default, the pool's workers would each take every core).
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import shardflow as sf  # noqa: E402
from shardflow import TarWriter, load_job  # noqa: E402
from shardflow.job.jobfile import load_job_file  # noqa: E402
from shardflow.tools.demo import shards_spec, write_synthetic_shards  # noqa: E402


def digests(directory: str) -> dict[str, str]:
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.tar"))):
        with open(path, "rb") as f:
            out[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
    return out


class Meter:
    """Wall time, and the CPU time that this process and all its descendants (pool workers, the
    forkserver, Dask nannies and workers) spent in the timed section. Descendants are sampled every
    50 ms, so a process that exits between two samples loses at most its last 50 ms."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self.psutil = psutil
        self.interval = interval
        self.me = psutil.Process()
        self.seen: dict[tuple[int, float], float] = {}  # (pid, create_time) -> last CPU seen
        self.base: dict[tuple[int, float], float] = {}
        self.stop = threading.Event()

    def _sample(self) -> None:
        for proc in [self.me, *self.me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
            except self.psutil.Error:
                continue
            self.seen[key] = times.user + times.system

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "Meter":
        self._sample()
        self.base = dict(self.seen)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.t0
        self.stop.set()
        self.thread.join()
        self._sample()
        self.cpu = sum(cpu - self.base.get(key, 0.0) for key, cpu in self.seen.items())


def local_cluster(workers: int):
    """The LocalCluster of "dask" and "recipe", with the settings of the one the backend starts (profiler
    off, worker-saturation 1.0): a plain LocalCluster's 10 ms profiler would be measured as the backend."""
    from distributed import Client

    from shardflow.backends.dask.client import start_local_cluster

    cluster = start_local_cluster(workers, threads_per_worker=1, dashboard_address=":0")
    return cluster, Client(cluster, set_as_default=False)


# ----------------------------------------------------------------------------- the recipe
def recipe_shard(process, url: str, out: str) -> int:
    """One shard the webdataset way: WebDataset(url).decode -> fn -> wds.TarWriter. Runs on a worker."""
    import webdataset as wds

    count = 0
    dataset = wds.WebDataset(url, shardshuffle=False, empty_check=False).decode("torchrgb")
    with wds.TarWriter(out) as sink:
        for sample in dataset:
            try:
                result = process(sample)
            except sf.SkipSample:
                continue
            # webdataset's encoder takes HWC numpy images for png (it does not take torch tensors)
            result["png"] = result["png"].permute(1, 2, 0).numpy()
            sink.write(result)
            count += 1
    return count


# ----------------------------------------------------------------------------- one timed run
def run_processes(job_path, spec, out, workers):
    job = load_job(job_path, inputs=spec, outputs=os.path.join(out, "{name}.tar"))
    with Meter() as meter:
        report = job.run("processes", workers=workers, progress=False)
    assert report.ok, str(report)
    return meter, report.stats.samples_in


def run_dask(job_path, spec, out, workers, client=None):
    job = load_job(job_path, inputs=spec, outputs=os.path.join(out, "{name}.tar"))
    with Meter() as meter:
        if client is None:  # dask+start: the backend starts (and stops) its own LocalCluster
            report = job.run("dask", workers=workers, dashboard_address=":0", progress=False)
        else:
            report = job.run("dask", client=client, progress=False)
    assert report.ok, str(report)
    return meter, report.stats.samples_in


def run_recipe(job_path, urls, out, client):
    import dask

    os.makedirs(out, exist_ok=True)
    process = load_job_file(job_path).fn  # the job file's function (travels by value, as with shardflow)
    with Meter() as meter:
        tasks = [dask.delayed(recipe_shard)(process, url, os.path.join(out, os.path.basename(url)))
                 for url in urls]
        counts = dask.compute(*tasks, scheduler=client)
    return meter, sum(counts)


# ----------------------------------------------------------------------------- overhead
def noop(sample):
    return sample


def overhead(root: str, tasks: int, workers: int, repeat: int) -> dict[str, float]:
    """Wall time per task of a no-op job over `tasks` one-sample shards."""
    tiny = os.path.join(root, "tiny")
    os.makedirs(tiny, exist_ok=True)
    for i in range(tasks):
        with TarWriter(os.path.join(tiny, f"t-{i:06d}.tar")) as writer:
            writer.write({"__key__": f"k{i:06d}", "txt": b"x"})
    spec = os.path.join(tiny, f"t-{{000000..{tasks - 1:06d}}}.tar")
    best: dict[str, dict[str, float]] = {}
    cluster, client = local_cluster(workers)
    try:
        client.submit(noop, 1).result()  # the cluster is warm: this measures per-task cost only
        for _ in range(repeat):
            for backend in ("processes", "dask"):
                out = os.path.join(root, f"tiny-out-{backend}")
                shutil.rmtree(out, ignore_errors=True)
                job = sf.ShardJob(noop, spec, os.path.join(out, "{name}.tar"))
                options = {"workers": workers} if backend == "processes" else {"client": client}
                with Meter() as meter:
                    report = job.run(backend, progress=False, **options)
                assert report.ok and report.done == tasks, str(report)
                wall_ms, cpu_ms = meter.wall / tasks * 1000, meter.cpu / tasks * 1000
                if wall_ms < best.get(backend, {}).get("wall_ms", float("inf")):
                    best[backend] = {"wall_ms": wall_ms, "cpu_ms": cpu_ms}
                print(f"  overhead {backend:10s} {meter.wall:6.2f} s for {tasks} tasks = {wall_ms:.2f} ms/task wall, "
                      f"{cpu_ms:.2f} ms/task CPU (all processes)", flush=True)
    finally:
        client.close()
        cluster.close()
    return best


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples", type=int, default=48, help="samples per shard")
    parser.add_argument("--size", default="512x384", help="image WIDTHxHEIGHT")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tiny", type=int, default=2000, help="tasks of the no-op overhead job (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny-repeat", type=int, default=1)
    parser.add_argument("--job", default=os.path.join(os.path.dirname(HERE), "jobs", "augment.py"))
    parser.add_argument("--variants", default="processes,dask,dask+start,recipe")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    width, height = map(int, args.size.split("x"))
    variants = args.variants.split(",")

    root = tempfile.mkdtemp(prefix="bench-dask-")
    try:
        urls = write_synthetic_shards(os.path.join(root, "in"), args.shards, args.samples, size=(width, height))
        spec = shards_spec(os.path.join(root, "in"), args.shards)
        total = args.shards * args.samples
        print(f"{args.shards} shards x {args.samples} samples ({width}x{height} JPEG), job {args.job}, "
              f"{args.workers} workers, {os.cpu_count()} cores, best of {args.repeat}", flush=True)
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}
        # one cluster for "dask" and "recipe", started before the clock, kept across repeats: a Dask
        # cluster outlives the jobs it runs, as the processes backend's forkserver outlives its pools
        cluster, client = local_cluster(args.workers)
        for attempt in range(args.repeat):
            for variant in variants:
                out = os.path.join(root, f"out-{variant}-{attempt}")
                if variant == "processes":
                    meter, n = run_processes(args.job, spec, out, args.workers)
                elif variant == "dask":
                    meter, n = run_dask(args.job, spec, out, args.workers, client)
                elif variant == "dask+start":
                    meter, n = run_dask(args.job, spec, out, args.workers)
                elif variant == "recipe":
                    meter, n = run_recipe(args.job, urls, out, client)
                else:
                    raise SystemExit(f"unknown variant {variant}")
                assert n == total, (variant, n, total)
                print(f"  {variant:10s} run {attempt + 1}: {meter.wall:6.2f} s  {n / meter.wall:7.1f} samples/s  "
                      f"{meter.cpu / n * 1000:6.1f} CPU ms/sample  (load {os.getloadavg()[0]:.1f})", flush=True)
                best[variant] = min(best.get(variant, meter.wall), meter.wall)
                cpu[variant] = min(cpu.get(variant, meter.cpu), meter.cpu)
        client.close()
        cluster.close()
        if "processes" in variants and "dask" in variants:
            same = digests(os.path.join(root, "out-dask-0")) == digests(os.path.join(root, "out-processes-0"))
            print(f"  dask output bytes == processes output bytes: {same}")
            assert same
        figures: dict[str, object] = {"shards": args.shards, "samples": total, "workers": args.workers,
                                      "size": args.size, "seconds": best,
                                      "samples_per_s": {k: total / v for k, v in best.items()},
                                      "cpu_ms_per_sample": {k: v / total * 1000 for k, v in cpu.items()}}
        print("\nvariant      samples/s   vs processes   CPU ms/sample   vs processes")
        for variant in variants:
            rate = total / best[variant]
            ratio = best["processes"] / best[variant] if "processes" in best else float("nan")
            cpu_ratio = cpu["processes"] / cpu[variant] if "processes" in cpu else float("nan")
            cpu_ms = cpu[variant] / total * 1000
            print(f"{variant:10s} {rate:11.1f}   {ratio:11.2f}x   {cpu_ms:13.1f}   {cpu_ratio:11.2f}x")
        if "dask" in best and "recipe" in best:
            print(f"dask vs recipe: {best['recipe'] / best['dask']:.2f}x samples/s, "
                  f"{cpu['recipe'] / cpu['dask']:.2f}x less CPU per sample")
        if args.tiny:
            per_task = overhead(root, args.tiny, args.workers, args.tiny_repeat)
            figures["overhead_ms_per_task"] = per_task
            p, d = per_task["processes"], per_task["dask"]
            print(f"\nno-op job, {args.tiny} tasks, per task: processes {p['wall_ms']:.2f} ms wall / "
                  f"{p['cpu_ms']:.2f} ms CPU, "
                  f"dask {d['wall_ms']:.2f} ms wall / {d['cpu_ms']:.2f} ms CPU")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
