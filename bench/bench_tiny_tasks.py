"""Tiny tasks measured from outside (issue 28, item 6): CPU per task of a no-op job over N one-sample
shards, all in: a fresh `python` process runs the job (imports, plan, run directory, markers, the
backend's workers or cluster, shutdown), and its CPU with every descendant's (getrusage of the reaped
children) is divided by N. A run of the same backend over one shard gives the fixed part, so the table
shows both the all-in figure and the per-task increment.

  processes       job.run("processes"): the default (a run of raw bytes this small, with no worker count
                  given, runs in the driver: backends/local.py `_in_driver`)
  processes-pool  job.run("processes", workers=2) with SHARDFLOW_ALWAYS_POOL=1 (the pool of 2 workers)
  dask            job.run("dask", workers=2): its own LocalCluster, started and stopped inside

    .venv/bin/python bench/bench_tiny_tasks.py --tasks 10000
    .venv/bin/python bench/bench_tiny_tasks.py --tasks 3000 --tasks-repeat 3   # medians of 3, rotated order
    .venv/bin/python bench/bench_tiny_tasks.py --reshard-mb 12 --repeat 5   # item 5: the fixed start cost
    .venv/bin/python bench/bench_tiny_tasks.py --tasks 10000 --tasks-repeat 2 --keep /var/tmp/tiny10k

On ext4 without a journal, files deleted on the disk in the last 6 minutes make every run slower (see
fresh_folder): --keep deletes nothing; run it when nothing else was deleted in the minutes before.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
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
    backend, spec, out, workers = sys.argv[1:5]
    given = {} if workers == "-" else {"workers": int(workers)}
    report = sf.ShardJob(noop, spec, out + "/{name}.tar").run(backend, progress=False, **given)
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


def children_cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of the reaped children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def _orphan_cpu(driver: "subprocess.Popen[bytes]", seen: dict[int, tuple[float, float]]) -> None:
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
                        seen[proc.pid] = (t.user + t.children_user, t.system + t.children_system)
                except psutil.Error:
                    pass
            time.sleep(0.02)
    except psutil.Error:
        pass


def run(backend: str, spec: str, out: str, script: str | None) -> tuple[float, float, float]:
    """(CPU seconds of the whole process tree, wall seconds, of the CPU the system part) of one fresh run
    (`script`, or without one `shardflow run reshard` from the command line). getrusage counts the
    driver and what it reaped; the fork server (and through it the pool's workers) is polled.

    `script` runs: processes with no worker count (a raw-bytes run this small runs in the driver),
    processes-pool with SHARDFLOW_ALWAYS_POOL=1 and workers=2, others with workers=2."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if backend == "processes-pool":
        env["SHARDFLOW_ALWAYS_POOL"] = "1"
    else:
        env.pop("SHARDFLOW_ALWAYS_POOL", None)
    name = "processes" if backend.startswith("processes") else backend
    command = [sys.executable, script, name, spec, out, "-" if backend == "processes" else "2"] if script else [
        sys.executable, "-m", "shardflow.cli", "run", "reshard", "--inputs", spec, "--outputs",
        out + "/{name}.tar", "--backend", name, "--no-progress"]
    before, started = children_cpu(), time.perf_counter()
    driver = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    seen: dict[int, tuple[float, float]] = {}
    _orphan_cpu(driver, seen)
    if driver.wait() != 0:
        raise SystemExit(f"{backend} run failed")
    wall = time.perf_counter() - started
    after = children_cpu()
    user = after[0] - before[0] + sum(u for u, _ in seen.values())
    system = after[1] - before[1] + sum(s for _, s in seen.values())
    return user + system, wall, system


def fresh_folder(root: str) -> str:
    """A new output folder for one run; the runs' outputs are all removed at the end, not in between.
    On ext4 without a journal (this machine's disk) an inode freed in the last minutes is skipped, by
    reading the inode table, whenever one is allocated: deleting the 3,000 outputs and 12,000 run-dir
    files of the previous run before the next one charged it 1-2.5 ms per task (pool: 2.63 ms per task
    right after such a deletion, 1.26-1.68 in a fresh folder; issue 28 round 3)."""
    return tempfile.mkdtemp(prefix="out-", dir=root)


def small_run(root: str, total_mb: float, repeat: int) -> None:
    """The fixed start cost: a small passthrough from the command line, processes against serial."""
    from bench_speed import make_shard

    for i in range(4):
        make_shard(os.path.join(root, f"in-{i:03d}.tar"), 60_000, int(total_mb * 1e6 / 4))
    spec = os.path.join(root, "in-{000..003}.tar")
    backends = ["processes", "processes-pool", "serial"]
    got: dict[str, list[tuple[float, float, float]]] = {b: [] for b in backends}
    for round_ in range(repeat):
        for backend in backends[round_ % 3:] + backends[:round_ % 3]:
            got[backend].append(run(backend, spec, os.path.join(root, "out"), None))
    print(f"`shardflow run reshard`, 4 shards, {total_mb:g} MB, medians of {repeat}, load {os.getloadavg()[0]:.1f}")
    print("| backend | wall s | CPU s (all processes) |\n|---|---:|---:|")
    for backend, runs in got.items():
        wall, cpu = statistics.median(r[1] for r in runs), statistics.median(r[0] for r in runs)
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
    ap.add_argument("--tasks-repeat", type=int, default=1,
                    help="repetitions of the --tasks runs, backends in rotated order (medians)")
    ap.add_argument("--keep", default=None,
                    help="work in this folder and delete nothing (inputs reused, outputs kept): see fresh_folder")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="bench-tiny-", dir=args.tmp)
    os.makedirs(root, exist_ok=True)
    try:
        if args.reshard_mb:
            return small_run(root, args.reshard_mb, args.repeat)
        script = os.path.join(root, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        make_inputs(os.path.join(root, "in"), args.tasks)
        many = os.path.join(root, "in", f"t-{{000000..{args.tasks - 1:06d}}}.tar")
        one = os.path.join(root, "in", "t-000000.tar")
        backends = args.backends.split(",")
        repeat = args.tasks_repeat
        print(f"{args.tasks} one-sample shards, no-op job, {repeat} rep(s) in rotated order, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        fixed = {b: run(b, one, fresh_folder(root), script)[0] for b in backends}
        got: dict[str, list[tuple[float, float, float]]] = {b: [] for b in backends}
        for round_ in range(repeat):
            shift = round_ % len(backends)
            for backend in backends[shift:] + backends[:shift]:
                got[backend].append(run(backend, many, fresh_folder(root), script))
        print("| backend | all in: CPU ms / task (median; each rep) | of it system | wall s | fixed (1 task): CPU s "
              "| increment: CPU ms / task |")
        print("|---|---:|---:|---:|---:|---:|")
        for backend, runs in got.items():
            cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            system = statistics.median(r[2] for r in runs)
            each = ", ".join(f"{r[0] / args.tasks * 1e3:.2f}" for r in runs)
            print(f"| {backend} | {cpu / args.tasks * 1e3:.2f} ({each}) | {system / args.tasks * 1e3:.2f} | "
                  f"{wall:.1f} | {fixed[backend]:.2f} | {(cpu - fixed[backend]) / (args.tasks - 1) * 1e3:.2f} |",
                  flush=True)
        print(f"load after {os.getloadavg()[0]:.1f}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
