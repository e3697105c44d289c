"""Thread limits in pods: N `shardflow worker` processes at once on N cores (N `cpu: 1` pods on one
node), torch with its default threads (one per core, each: N x N threads) against OMP_NUM_THREADS=1,
what the manifests now set from `--cpu 1`.

Run: python bench/bench_threads.py [--pods 2] [--samples 24] [--size 256] [--repeat 2]
Both variants run back to back each round; the table gives each one's best wall time and the median
ratio within a round (same load for both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '''
import torch

PARAMS = {"size": 256, "rounds": 12}


def process(sample):
    g = torch.Generator().manual_seed(int(sample["__key__"][1:]))
    x = torch.randn(PARAMS["size"], PARAMS["size"], generator=g)
    for _ in range(PARAMS["rounds"]):
        x = torch.tanh(x @ x / PARAMS["size"])
    return {"__key__": sample["__key__"], "txt": str(float(x.sum())).encode()}
'''


def _plan(root: Path, pods: int, samples: int, size: int) -> str:
    from shardflow import TarWriter, load_job

    (root / "in").mkdir(parents=True)
    for shard in range(pods):
        with TarWriter(str(root / "in" / f"in-{shard:06d}.tar")) as writer:
            for i in range(samples):
                writer.write({"__key__": f"k{shard * samples + i:06d}", "txt": b"x"})
    (root / "job.py").write_text(JOB)
    job = load_job(root / "job.py", inputs=str(root / "in" / f"in-{{000000..{pods - 1:06d}}}.tar"),
                   outputs=f"{root}/out/{{name}}.tar", overrides={"size": size})
    job.prepare()
    return job.run_dir


def _run(run_dir: str, pods: int, threads: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "OPENBLAS_NUM_THREADS")}
    if threads:
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)
    for marker in Path(run_dir, "done").glob("*.json"):
        marker.unlink()
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "shardflow.cli", "worker", "--run-dir", run_dir,
                               "--index", str(i)], env=env, stdout=subprocess.DEVNULL) for i in range(pods)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a worker failed")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _plan(Path(tmp), args.pods, args.samples, args.size)
        default, limited, ratios = [], [], []
        for _ in range(args.repeat):
            a, b = _run(run_dir, args.pods, None), _run(run_dir, args.pods, "1")
            default.append(a)
            limited.append(b)
            ratios.append(a / b)
    print(f"{args.pods} workers x {args.samples} samples on {os.cpu_count()} cores, torch {args.size}x{args.size}")
    print(f"torch default threads : {min(default):6.2f} s (best of {args.repeat})")
    print(f"OMP_NUM_THREADS=1     : {min(limited):6.2f} s")
    print(f"ratio default/limited : {statistics.median(ratios):.2f}x (median within rounds)")


if __name__ == "__main__":
    main()
