"""Batched-job benchmark: the built-in `augment_batch` (batch 64) against the per-sample `augment` job.

Same shards (synthetic 512x384 photo-like JPEG + json), same backend and workers, each variant a
fresh `shardflow run` command (worker start-up, plan, run directory counted):

    augment              per sample: decode torchrgb (float), flip, noise; png (level 1), 512x384
    augment_batch        batches of 64: decode torchrgb8, random resized crop to 224, flip, colour
                         jitter, noise (batched ops); jpg q90, 224x224 (the job's defaults)
    augment_batch-384    the same at 384x384 output (about as many pixels as the input)
    augment_batch-serial the same as augment_batch without the overlap threads
                         (SHARDFLOW_BATCH_OVERLAP=0): what reading and writing beside fn gives

The two jobs do not do the same work (the batched one crops and writes JPEG, as a training
pipeline's offline augmentation would); the 384 variant keeps the output size comparable.

Run: python bench/bench_batch.py [--shards 4] [--per-shard 64] [--workers 2] [--backend processes]
     [--repeat 2] [--gpu]
`--gpu` adds `augment_batch-cuda` (decode torchrgb8-cuda, batch 128, device cuda, one worker per GPU)
and prints how busy the GPUs were (nvidia-smi utilization.gpu sampled every 0.2 s); it has not been run
yet (the machine this was written on has no GPU).
Variants run back to back in each round. Three samples/s per variant: `command` (the whole command,
imports included), `run` (from the plan on: worker start-up and tasks) and `tasks` (the tasks' own
time, summed and divided by the workers: the steady rate a long run approaches). Each is the best
round; `x augment` is the median over rounds of the ratio to `augment` in the same round (the steadier
figure on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shardflow.tools.demo import shards_spec, write_synthetic_shards  # noqa: E402

VARIANTS = {
    "augment": (["augment"], {}),
    "augment_batch": (["augment_batch", "--set", "batch_size=64"], {}),
    "augment_batch-384": (["augment_batch", "--set", "batch_size=64", "--set", "size=384"], {}),
    "augment_batch-serial": (["augment_batch", "--set", "batch_size=64"], {"SHARDFLOW_BATCH_OVERLAP": "0"}),
}
GPU_VARIANTS = {  # --gpu: nvjpeg decode + augment + JPEG encode on the GPU, one worker per GPU
    "augment_batch-cuda": (["augment_batch", "--set", "batch_size=128", "--set", "decode=torchrgb8-cuda",
                            "--set", "device=cuda", "--gpus-per-worker", "1"], {}),
}


def run_variant(name: str, inputs: str, out: Path, backend: str, workers: int) -> tuple[float, float, float]:
    """(seconds of the whole command, of the run (from the plan on: workers started, tasks run), of the
    tasks (summed over tasks, divided by the workers)) for one `shardflow run` in a fresh process."""
    args, env = VARIANTS[name]
    command = [sys.executable, "-c", "from shardflow.cli import main; main()", "run", *args, "--inputs", inputs,
               "--outputs", str(out / "{name}.tar"), "--backend", backend, "--no-progress", "--json"]
    if backend == "processes" and "--gpus-per-worker" not in args:
        command += ["--workers", str(workers)]
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    sampler = _gpu_sampler() if name.endswith("-cuda") else None
    started = time.perf_counter()
    proc = subprocess.run(command, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if sampler is not None:
        sampler.terminate()
        busy = [float(x) for x in sampler.communicate()[0].split() if x.replace(".", "", 1).isdigit()]
        if busy:
            print(f"{name}: GPU busy {sum(busy) / len(busy):.0f} % (nvidia-smi utilization.gpu every 0.2 s, "
                  f"mean over the command, all GPUs)")
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr}")
    report = json.loads(proc.stdout)
    parallel = min(workers, max(1, report["done"])) if backend == "processes" else 1
    return seconds, report["seconds"], report["stats"]["seconds"] / parallel


def _gpu_sampler() -> subprocess.Popen | None:
    """nvidia-smi printing GPU utilisation every 200 ms, or None without nvidia-smi."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    return subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-shard", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="processes", choices=["processes", "serial"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(VARIANTS))
    parser.add_argument("--gpu", action="store_true", help="add the GPU variants (needs CUDA; not run here)")
    args = parser.parse_args()
    if args.gpu:
        VARIANTS.update(GPU_VARIANTS)
        args.only += list(GPU_VARIANTS)
    samples = args.shards * args.per_shard
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        root = Path(tmp)
        write_synthetic_shards(root / "in", args.shards, args.per_shard, distinct=None)
        inputs = shards_spec(root / "in", args.shards)
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in args.only}
        ratios: dict[str, list[tuple[float, float, float]]] = {name: [] for name in args.only}
        for round_ in range(args.repeat):
            for name in args.only:
                times[name].append(run_variant(name, inputs, root / f"out-{name}-{round_}", args.backend,
                                               args.workers))
                print(f"round {round_ + 1}: {name}: " + " / ".join(f"{samples / t:.1f}" for t in times[name][-1])
                      + " samples/s (command / run / tasks)", flush=True)  # kept if a later variant fails
            for name in args.only:
                if "augment" in times:
                    base = times["augment"][-1]
                    ratios[name].append(tuple(b / t for b, t in zip(base, times[name][-1])))
        _table(args, samples, times, ratios)


def _table(args: argparse.Namespace, samples: int, times: dict, ratios: dict) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{samples} images 512x384, backend {args.backend}"
          f"{f' --workers {args.workers}' if args.backend == 'processes' else ''}, {cores} cores, "
          f"{args.repeat} rounds; samples/s: best round; x augment: median over rounds of the same-round ratio")
    print(f"{'variant':22} {'command':>9} {'run':>9} {'tasks':>9}   {'x augment: command / run / tasks':>34}")
    for name in args.only:
        best = [samples / min(t[i] for t in times[name]) for i in range(3)]
        ratio = " / ".join(f"{statistics.median(r[i] for r in ratios[name]):.2f}x" for i in range(3)) \
            if ratios[name] else "-"
        print(f"{name:22} {best[0]:9.1f} {best[1]:9.1f} {best[2]:9.1f}   {ratio:>34}")


if __name__ == "__main__":
    main()
