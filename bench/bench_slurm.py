"""shardflow through a real one-node Slurm (tests/support/slurm.py) vs the processes backend, same 2 cores.

Two measures, each `--repeat` rounds in rotated order, medians:

  tiny     --tiny-tasks shards of one 1 KiB sample each, through `job.run("slurm", ...)` with one task
           per array task (K=1, what the automatic chunking gives below 1000 tasks) and with the tasks
           in two array tasks (K=tasks/2), and through `job.run("processes", workers=2)`: wall time
           and CPU milliseconds per task: this process and its descendants, plus everything Slurm ran
           (its daemons are moved into a cgroup v1 `cpuacct` group: slurmstepd, the batch shells and
           the workers, re-parented to init, stay in it), so other users of the machine do not count.
  augment  jobs/augment.py (JPEG -> flip, noise -> PNG) over --shards x --per-shard 512x384 images:
           Slurm with two array tasks of --cpus-per-task 1 (both cores) vs processes with 2 workers
           (its fork server stopped before each run, as bench_augment_ray.py does: worker start and
           the job's imports are inside both clocks); the ratio is Slurm's images/s over the
           processes backend's (target >= 0.9).

The cluster is started once before the clock (its ~10-40 s start is excluded, as a login node's
cluster is already up); submission, scheduling and polling are inside it.

    .venv/bin/python bench/bench_slurm.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

VENV_BIN = Path(sys.executable).parent
IDENTITY = '''def process(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}
'''


class SlurmCpu:
    """CPU seconds of everything Slurm runs: its daemons moved into a cgroup (v1 cpuacct) of their own, so
    slurmstepd, the batch shells and the workers they start (re-parented to init) are counted too."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, pids: list[int]) -> None:
        self.group = self.ROOT / f"shardflow-bench-slurm-{os.getpid()}"
        self.group.mkdir()
        for pid in pids:
            (self.group / "cgroup.procs").write_text(str(pid))

    def seconds(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        for pid in (self.group / "cgroup.procs").read_text().split():  # left over: back to the root group
            try:
                (self.ROOT / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.group.rmdir()
        except OSError:
            pass


def measured(run: Callable[[], Any], slurm_cpu: SlurmCpu | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds): this process and its descendants (the pool's workers, the fork server,
    sbatch/squeue), plus what Slurm's cgroup used meanwhile."""
    from cpu_time import descendants_cpu, own_cpu

    def cpu() -> float:
        return own_cpu() + descendants_cpu() + (slurm_cpu.seconds() if slurm_cpu else 0.0)

    before, started = cpu(), time.perf_counter()
    run()
    return time.perf_counter() - started, cpu() - before


def tiny_inputs(folder: Path, tasks: int) -> str:
    from shardflow.shards.writer import TarWriter

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(tasks):
        with TarWriter(str(folder / f"tiny-{i:06d}.tar")) as writer:
            writer.write({"__key__": f"k{i}", "txt": b"x" * 1024})
    return str(folder / f"tiny-{{000000..{tasks - 1:06d}}}.tar")


def runner(job_file: Path, spec: str, out: Path, backend: str, **options: Any) -> Callable[[], None]:
    from shardflow import load_job

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)
        if backend == "processes":  # a cold start each time, as an array task has: no fork server kept warm
            from multiprocessing import forkserver

            stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
            if stop is not None:
                stop()
        job = load_job(str(job_file), inputs=spec, outputs=str(out / "{name}.tar"), overrides=options.pop("set", {}))
        report = job.run(backend, progress=False, **options)
        assert report.ok, report

    return run


def rounds(variants: dict[str, Callable[[], None]], repeat: int,
           slurm_cpu: SlurmCpu | None) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(repeat):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            wall, cpu = measured(variants[name], slurm_cpu)
            results[name].append((wall, cpu))
            print(f"  round {round_ + 1} {name:22s} {wall:6.2f} s wall, {cpu:6.2f} s CPU", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny-tasks", type=int, default=40)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["tiny", "augment"])
    args = ap.parse_args()

    from shardflow.tools.demo import shards_spec, write_synthetic_shards
    from tests.support.slurm import start_cluster

    scratch = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    cluster = start_cluster(scratch / "slurm")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the daemons on kill too (finally below)
    os.environ.update(cluster.env())
    try:
        slurm_cpu: SlurmCpu | None = SlurmCpu([p.pid for p in cluster.procs.values()])
    except OSError as exc:
        print(f"no cgroup for Slurm's CPU ({exc}): CPU figures leave Slurm's processes out", flush=True)
        slurm_cpu = None
    slurm = dict(shared_fs=True, setup=[f"source {VENV_BIN}/activate"], log_dir=str(scratch / "logs"), poll=0.5)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}; cluster up in "
          f"{scratch / 'slurm'}", flush=True)
    try:
        if args.only in (None, "tiny"):
            job_file = scratch / "identity.py"
            job_file.write_text(IDENTITY)
            spec, n = tiny_inputs(scratch / "tiny", args.tiny_tasks), args.tiny_tasks
            variants = {
                "processes (2 workers)": runner(job_file, spec, scratch / "o1", "processes", workers=2),
                "slurm K=1": runner(job_file, spec, scratch / "o2", "slurm", tasks_per_array_task=1, **slurm),
                f"slurm K={n // 2}": runner(job_file, spec, scratch / "o3", "slurm", tasks_per_array_task=n // 2,
                                            **slurm),
            }
            print(f"tiny: {n} tasks of one 1 KiB sample", flush=True)
            results = rounds(variants, args.repeat, slurm_cpu)
            for name, rows in results.items():
                wall = statistics.median(r[0] for r in rows)
                cpu = statistics.median(r[1] for r in rows)
                print(f"  {name:22s} median {wall / n * 1000:7.1f} ms wall/task, {cpu / n * 1000:7.1f} ms CPU/task")
        if args.only in (None, "augment"):
            write_synthetic_shards(scratch / "aug", args.shards, args.per_shard)
            spec = shards_spec(scratch / "aug", args.shards)
            job_file = REPO / "jobs" / "augment.py"
            variants = {
                "processes (2 workers)": runner(job_file, spec, scratch / "a1", "processes", workers=2),
                "slurm (2 array tasks)": runner(job_file, spec, scratch / "a2", "slurm",
                                                tasks_per_array_task=-(-args.shards // 2), **slurm),
            }
            total = args.shards * args.per_shard
            print(f"augment: {total} images ({args.shards} shards x {args.per_shard})", flush=True)
            results = rounds(variants, args.repeat, slurm_cpu)
            speed = {name: total / statistics.median(r[0] for r in rows) for name, rows in results.items()}
            ratios = [p[0] / s[0] for p, s in zip(results["processes (2 workers)"], results["slurm (2 array tasks)"])]
            for name, value in speed.items():
                print(f"  {name:22s} median {value:6.1f} images/s")
            print(f"  slurm / processes: median {statistics.median(ratios):.2f}x (per round: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)})")
            cpu = [p[1] / s[1] for p, s in zip(results["processes (2 workers)"], results["slurm (2 array tasks)"])]
            print(f"  CPU per image, processes / slurm: median {statistics.median(cpu):.2f}x (per round: "
                  f"{', '.join(f'{r:.2f}' for r in cpu)}): the speed ratio on a machine with nothing else to run")
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        cluster.stop()
        if slurm_cpu is not None:
            slurm_cpu.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
