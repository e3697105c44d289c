"""Tiny tasks measured from outside (issue 28, item 6): CPU per task of a no-op job over N one-sample
shards, all in: a fresh `python` process runs the job (imports, plan, run directory, markers, the
backend's workers or cluster, shutdown), and its CPU with every descendant's (getrusage of the reaped
children) is divided by N. A run of the same backend over one shard gives the fixed part, so the table
shows both the all-in figure and the per-task increment.

  processes       job.run("processes", workers=2): the default (a run of raw bytes this small runs in
                  the driver: backends/local.py `_in_driver`)
  processes-pool  the same with SHARDFLOW_ALWAYS_POOL=1 (the pool of 2 workers, whatever the size)
  dask            job.run("dask", workers=2): its own LocalCluster, started and stopped inside

    .venv/bin/python bench/bench_tiny_tasks.py --tasks 10000
    .venv/bin/python bench/bench_tiny_tasks.py --reshard-mb 12 --repeat 5   # item 5: the fixed start cost
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

CHILD = """
import sys
import shardflow as sf

def noop(sample):
    return sample

if __name__ == "__main__":
    backend, spec, out = sys.argv[1:4]
    report = sf.ShardJob(noop, spec, out + "/{name}.tar").run(backend, workers=2, progress=False)
    assert report.ok, str(report)
"""


def make_inputs(folder: str, tasks: int) -> None:
    from shardflow import TarWriter

    os.makedirs(folder, exist_ok=True)
    for i in range(tasks):
        path = os.path.join(folder, f"t-{i:06d}.tar")
        if not os.path.exists(path):
            with TarWriter(path) as writer:
                writer.write({"__key__": f"k{i:06d}", "txt": b"x"})


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _orphan_cpu(driver: "subprocess.Popen[bytes]", seen: dict[int, float]) -> None:
    """Poll the driver's fork server (it is never reaped by the driver, so getrusage misses it and the
    pool's workers it reaped): its CPU with its reaped children's, last seen before it exits."""
    import psutil

    try:
        root = psutil.Process(driver.pid)
        while driver.poll() is None:
            for proc in root.children():
                try:
                    if "forkserver" in " ".join(proc.cmdline()):
                        t = proc.cpu_times()
                        seen[proc.pid] = t.user + t.system + t.children_user + t.children_system
                except psutil.Error:
                    pass
            time.sleep(0.02)
    except psutil.Error:
        pass


def run(backend: str, spec: str, out: str, script: str | None) -> tuple[float, float]:
    """(CPU seconds of the whole process tree, wall seconds) of one fresh run (`script`, or without one
    `shardflow run reshard` from the command line). getrusage counts the driver and what it reaped;
    the fork server (and through it the pool's workers) is polled."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if backend == "processes-pool":
        env["SHARDFLOW_ALWAYS_POOL"] = "1"
    else:
        env.pop("SHARDFLOW_ALWAYS_POOL", None)
    name = "processes" if backend.startswith("processes") else backend
    command = [sys.executable, script, name, spec, out] if script else [
        sys.executable, "-m", "shardflow.cli", "run", "reshard", "--inputs", spec, "--outputs",
        out + "/{name}.tar", "--backend", name, "--no-progress"]
    before, started = children_cpu(), time.perf_counter()
    driver = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    seen: dict[int, float] = {}
    _orphan_cpu(driver, seen)
    if driver.wait() != 0:
        raise SystemExit(f"{backend} run failed")
    return children_cpu() - before + sum(seen.values()), time.perf_counter() - started


def small_run(root: str, total_mb: float, repeat: int) -> None:
    """The fixed start cost: a small passthrough from the command line, processes against serial."""
    import statistics

    from bench_speed import make_shard

    for i in range(4):
        make_shard(os.path.join(root, f"in-{i:03d}.tar"), 60_000, int(total_mb * 1e6 / 4))
    spec = os.path.join(root, "in-{000..003}.tar")
    backends = ["processes", "processes-pool", "serial"]
    got: dict[str, list[tuple[float, float]]] = {b: [] for b in backends}
    for round_ in range(repeat):
        for backend in backends[round_ % 3:] + backends[:round_ % 3]:
            got[backend].append(run(backend, spec, os.path.join(root, "out"), None))
    print(f"`shardflow run reshard`, 4 shards, {total_mb:g} MB, medians of {repeat}, load {os.getloadavg()[0]:.1f}")
    print("| backend | wall s | CPU s (all processes) |\n|---|---:|---:|")
    for backend, runs in got.items():
        wall, cpu = statistics.median(w for _, w in runs), statistics.median(c for c, _ in runs)
        print(f"| {backend} | {wall:.2f} | {cpu:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--backends", default="processes,processes-pool,dask")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--reshard-mb", type=float, default=0,
                    help="instead: `shardflow run reshard` over 4 shards of this many MB in all (60 KB samples), "
                         "--repeat times per backend (processes, serial), rotated")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-tiny-", dir=args.tmp)
    try:
        if args.reshard_mb:
            return small_run(root, args.reshard_mb, args.repeat)
        script = os.path.join(root, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        make_inputs(os.path.join(root, "in"), args.tasks)
        many = os.path.join(root, "in", f"t-{{000000..{args.tasks - 1:06d}}}.tar")
        one = os.path.join(root, "in", "t-000000.tar")
        print(f"{args.tasks} one-sample shards, no-op job, load {os.getloadavg()[0]:.1f}", flush=True)
        print("| backend | all in: CPU ms / task | wall s | fixed (1 task): CPU s | increment: CPU ms / task |")
        print("|---|---:|---:|---:|---:|")
        for backend in args.backends.split(","):
            fixed, _ = run(backend, one, os.path.join(root, "out1"), script)
            cpu, wall = run(backend, many, os.path.join(root, "out"), script)
            print(f"| {backend} | {cpu / args.tasks * 1e3:.2f} | {wall:.1f} | {fixed:.2f} | "
                  f"{(cpu - fixed) / (args.tasks - 1) * 1e3:.2f} |", flush=True)
        print(f"load after {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
