"""Training-reader benchmark: shardflow.ShardDataset vs webdataset vs the pure JPEG-decode limit.

Same shards (real JPEGs, 256x256, ~20 KB, synthetic but not noise), same decode (JPEG -> uint8 CHW
tensor), same batch size, same shuffle buffer, same number of worker processes, one run:

  shardflow   ShardDataset(decode="torchrgb8", batch_size=B, shuffle=S) + shardflow.Loader(workers)
  webdataset  WebDataset(urls, shardshuffle=...).shuffle(S).decode("torchrgb8").to_tuple(...)
              .batched(B) + WebLoader(batch_size=None, num_workers=workers)
  limit       the same JPEG bytes, already in memory, decoded by `workers` processes into the same
              uint8 CHW tensors (codecs' torchrgb8 decode), no I/O, no tar, no batches, no IPC
  shardflow-cl  ShardDataset(..., channels_last=True): the same values in channels-last memory, so
              no HWC -> CHW transposition; compared with limit-hwc (JPEG -> HWC uint8, decode only)
  shardflow-Nep, shardflow-cl-Nep  one Loader iterated for --epochs epochs, as training does (the
              rows above build a new Loader for one epoch, so each pays forking and starting the
              workers, which the limit does not): samples/s of its best epoch after the first
              (persistent workers: no start-up), CPU per image over all its epochs (start-up included)
              and of its cheapest epoch after the first

Reported: samples/s over the whole epoch (startup included; see -Nep), ratio to webdataset, % of the decode
limit, and time to the first batch (from constructing the dataset). Each reader runs `--repeat`
times, alternating, and the best run of each is kept (the machine may be shared).

    python bench/bench_reader.py                       # 4096 images, 2 workers, batch 64
    python bench/bench_reader.py --gpu                 # also the batched GPU JPEG decode path
    python bench/bench_reader.py --json out.json       # figures as JSON too
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from cpu_time import descendants_cpu, own_cpu  # noqa: E402

import shardflow as sf  # noqa: E402
from shardflow import Decoder, ShardWriter  # noqa: E402
from shardflow.codecs.planes import limit_threads  # noqa: E402

# ------------------------------------------------------------------------------------- data


def synthetic_jpeg(i: int, size: int = 256, quality: int = 95) -> bytes:
    """A smooth, colourful, non-noise image (sinusoids + discs): ~20 KB at 256x256, quality 95."""
    from PIL import Image

    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    img = np.full((size, size, 3), 127.0, np.float32)
    for c in range(3):
        for _ in range(3):
            fx, fy = rng.uniform(0.02, 0.35, 2)
            img[..., c] += 30 * np.sin(fx * x + fy * y + rng.uniform(0, 6.3))
    for _ in range(4):
        cx, cy, r = rng.integers(20, size - 20, 3)
        img[(x - cx) ** 2 + (y - cy) ** 2 < (r // 3) ** 2] = rng.integers(0, 255, 3)
    buf = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def make_shards(directory: str, n: int, per_shard: int) -> list[str]:
    """Write the shards once (and a run-dir summary.json, so ShardDataset knows len())."""
    stamp = os.path.join(directory, f".done-{n}-{per_shard}")
    nshards = -(-n // per_shard)
    urls = [os.path.join(directory, f"train-{i:04d}.tar") for i in range(nshards)]
    if os.path.exists(stamp):
        return urls
    os.makedirs(directory, exist_ok=True)
    with ShardWriter(os.path.join(directory, "train-%04d.tar"), maxcount=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"{i:07d}", "jpg": synthetic_jpeg(i), "cls": str(i % 1000).encode()})
    os.makedirs(os.path.join(directory, "_shardflow"), exist_ok=True)
    with open(os.path.join(directory, "_shardflow", "summary.json"), "w") as f:
        json.dump({"shards": [s.to_json() for s in w.shards]}, f)
    open(stamp, "w").close()
    return urls


def all_jpegs(urls: list[str]) -> list[bytes]:
    out = []
    for url in urls:
        with open(url, "rb") as f:
            out.extend(s["jpg"] for s in sf.read_samples(f, url))
    return out


# ------------------------------------------------------------------------------------- runs


def run_shardflow(urls, args, gpu=False, channels_last=False):
    cpu0, t0 = _cpu(), time.perf_counter()
    ds = sf.ShardDataset(urls, decode="torchrgb8-cuda" if gpu else "torchrgb8", batch_size=args.batch,
                         shuffle=args.shuffle, seed=0, to_tuple="jpg cls", on_error="raise",
                         channels_last=channels_last)
    # consume() holds the only reference: dropping it stops the workers, so their CPU time counts
    return consume(sf.Loader(ds, num_workers=args.workers, pin_memory=gpu), t0, gpu, cpu0)


def run_shardflow_epochs(urls, args, channels_last=False):
    """One Loader, --epochs epochs: the best epoch after the first, CPU over all of them, and the
    CPU of its cheapest epoch after the first (the workers live on: read from /proc)."""
    cpu0, t0 = _cpu(), time.perf_counter()
    ds = sf.ShardDataset(urls, decode="torchrgb8", batch_size=args.batch, shuffle=args.shuffle, seed=0,
                         to_tuple="jpg cls", on_error="raise", channels_last=channels_last)
    loader = sf.Loader(ds, num_workers=args.workers, pin_memory=False)
    walls, cpus, n, first = [], [], 0, None
    for _ in range(args.epochs):
        t, c = time.perf_counter(), _cpu()
        for images, _labels in loader:
            if first is None:
                first = time.perf_counter() - t0
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 256, 256), (images.dtype, images.shape)
            n += images.shape[0]
        walls.append(time.perf_counter() - t)
        cpus.append(_cpu() - c)
    del loader, images, _labels  # the workers stop and are reaped: their CPU time counts below
    cpu = _cpu() - cpu0
    per_epoch, wall = n // args.epochs, min(walls[1:] or walls)
    return {"samples": per_epoch, "seconds": wall, "samples_per_s": per_epoch / wall, "first_batch_s": first,
            "epoch_seconds": walls, "epoch_cpu_s": cpus, "cpu_s": cpu, "cpu_us_per_sample": 1e6 * cpu / n,
            "steady_cpu_us_per_sample": 1e6 * min(cpus[1:] or cpus) / per_epoch}


def run_webdataset(urls, args):
    import webdataset as wds

    cpu0, t0 = _cpu(), time.perf_counter()
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(args.shuffle)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .batched(args.batch)
    )
    loader = wds.WebLoader(ds, batch_size=None, num_workers=args.workers)
    return consume(loader, t0, False, cpu0)


def _cpu() -> float:
    """CPU seconds of this process and of every process it started, reaped (a fresh Loader's
    workers) or alive (persistent workers between epochs)."""
    return own_cpu() + descendants_cpu()


def consume(loader, t0, gpu, cpu0):
    first = None
    n = 0
    for images, _labels in loader:
        if first is None:
            if gpu:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 256, 256), (images.dtype, images.shape)
        n += images.shape[0]
    if gpu:
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    del loader
    cpu = _cpu() - cpu0
    return {"samples": n, "seconds": total, "samples_per_s": n / total, "first_batch_s": first,
            "cpu_s": cpu, "cpu_us_per_sample": 1e6 * cpu / n}


_JPEGS: list[bytes] = []


def _decode_part(job: tuple[str, int, int]) -> tuple[float, float]:
    torch.set_num_threads(1)
    limit_threads(1)  # OpenCV's split on one thread, as in the Loader's workers (fair to the limit)
    spec, lo, hi = job
    decode = Decoder(spec)
    t, c = time.perf_counter(), time.process_time()
    for data in _JPEGS[lo:hi]:
        img = decode({"jpg": data})["jpg"]
        if spec == "rgb8":
            torch.from_numpy(img)
    return time.perf_counter() - t, time.process_time() - c


def run_limit(jpegs, workers, spec="torchrgb8"):
    """Each of `workers` forked processes decodes its share of the in-memory JPEGs; the limit is
    the samples/s of the slowest share (start-up and data transfer not counted).

    spec "torchrgb8": JPEG -> uint8 CHW tensor, the very decode the readers do (codecs, simplejpeg
    then HWC -> CHW); "rgb8": JPEG -> uint8 HWC (the decoder's own output, no transposition)."""
    global _JPEGS
    _JPEGS = jpegs
    n = len(jpegs)
    parts = [(spec, w * n // workers, (w + 1) * n // workers) for w in range(workers)]
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_part, [(spec, 0, min(64, n))] * workers)  # warm up (imports, simplejpeg)
        results = pool.map(_decode_part, parts)
    wall = max(r[0] for r in results)
    cpu = sum(r[1] for r in results)
    return {"samples": n, "seconds": wall, "samples_per_s": n / wall, "cpu_s": cpu, "cpu_us_per_sample": 1e6 * cpu / n}


# ------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(os.path.dirname(HERE), ".bench", "reader"))
    p.add_argument("--n", type=int, default=4096, help="images")
    p.add_argument("--per-shard", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shuffle", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="epochs of one Loader in the -Nep rows (0: no such rows)")
    p.add_argument("--gpu", action="store_true", help="also run the batched GPU JPEG decode (decode='torchrgb8-cuda')")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)

    urls = make_shards(args.data, args.n, args.per_shard)
    jpegs = all_jpegs(urls)
    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1000
    print(f"{len(jpegs)} JPEGs, 256x256, {mean_kb:.1f} KB mean, {len(urls)} shards; batch {args.batch}, "
          f"{args.workers} workers, shuffle {args.shuffle}; {os.cpu_count()} CPUs; torch {torch.__version__}")

    runs: dict[str, list[dict]] = {"shardflow": [], "shardflow-cl": [], "webdataset": [], "limit": [],
                                   "limit-hwc": []}
    ep = f"-{args.epochs}ep"
    if args.epochs > 0:
        runs["shardflow" + ep], runs["shardflow-cl" + ep] = [], []
    have_gpu = args.gpu and torch.cuda.is_available()
    if have_gpu:
        runs["shardflow-gpu"] = []
    elif args.gpu:
        print("--gpu: no CUDA device here; the GPU path falls back to CPU decode (not timed)")
    for _ in range(args.repeat):
        runs["limit"].append(run_limit(jpegs, args.workers))
        runs["limit-hwc"].append(run_limit(jpegs, args.workers, "rgb8"))
        runs["webdataset"].append(run_webdataset(urls, args))
        runs["shardflow"].append(run_shardflow(urls, args))
        runs["shardflow-cl"].append(run_shardflow(urls, args, channels_last=True))
        if args.epochs > 0:
            runs["shardflow" + ep].append(run_shardflow_epochs(urls, args))
            runs["shardflow-cl" + ep].append(run_shardflow_epochs(urls, args, channels_last=True))
        if have_gpu:
            runs["shardflow-gpu"].append(run_shardflow(urls, args, gpu=True))
    for name, rs in runs.items():
        for r in rs:
            if r["samples"] != len(jpegs):
                raise SystemExit(f"{name} delivered {r['samples']} samples, expected {len(jpegs)}")

    best = {name: max(rs, key=lambda r: r["samples_per_s"]) for name, rs in runs.items()}
    first = {name: min(r["first_batch_s"] for r in rs) for name, rs in runs.items() if "first_batch_s" in rs[0]}
    cpu = {name: min(r["cpu_us_per_sample"] for r in rs) for name, rs in runs.items()}
    wds_rate, limit = best["webdataset"]["samples_per_s"], best["limit"]["samples_per_s"]
    print()
    print(f"{'reader':18s} {'samples/s':>9s} {'vs wds':>7s} {'% limit':>8s} {'CPU us/img':>10s} {'1st batch':>9s}"
          "   (samples/s of each run)")
    for name in runs:
        rate = best[name]["samples_per_s"]
        fb = f"{first[name] * 1000:7.0f}ms" if name in first else " " * 9
        all_runs = ", ".join(f"{x['samples_per_s']:.0f}" for x in runs[name])
        print(f"{name:18s} {rate:9.0f} {rate / wds_rate:6.2f}x {100 * rate / limit:7.1f}% {cpu[name]:10.0f} {fb}"
              f"   ({all_runs})")

    def per_round(a: str, b: str) -> float:  # median over rounds of a/b measured side by side
        return statistics.median(x["samples_per_s"] / y["samples_per_s"] for x, y in zip(runs[a], runs[b]))

    summary = {
        "config": {k: getattr(args, k) for k in ("n", "per_shard", "batch", "workers", "shuffle", "repeat")},
        "jpeg_kb": round(mean_kb, 1), "cpus": os.cpu_count(), "torch": torch.__version__,
        "best": best, "first_batch_s": first, "cpu_us_per_sample": cpu, "runs": runs,
        "ratio_vs_webdataset": best["shardflow"]["samples_per_s"] / wds_rate,
        "fraction_of_limit": best["shardflow"]["samples_per_s"] / limit,
        "fraction_of_limit_cpu": cpu["limit"] / cpu["shardflow"],
        "channels_last_fraction_of_hwc_limit":
            best["shardflow-cl"]["samples_per_s"] / best["limit-hwc"]["samples_per_s"],
        "per_round_median": {
            "shardflow/webdataset": per_round("shardflow", "webdataset"),
            "shardflow/limit": per_round("shardflow", "limit"),
            "shardflow-cl/limit-hwc": per_round("shardflow-cl", "limit-hwc"),
        },
    }
    if args.epochs > 0:
        summary["epochs"] = {
            "fraction_of_limit": best["shardflow" + ep]["samples_per_s"] / limit,
            "fraction_of_limit_cpu": cpu["limit"] / cpu["shardflow" + ep],
            "channels_last_fraction_of_hwc_limit":
                best["shardflow-cl" + ep]["samples_per_s"] / best["limit-hwc"]["samples_per_s"],
            "per_round_median": per_round("shardflow" + ep, "limit"),
            "steady_cpu_us_per_sample": min(r["steady_cpu_us_per_sample"] for r in runs["shardflow" + ep]),
            "steady_cpu_us_per_sample_cl": min(r["steady_cpu_us_per_sample"] for r in runs["shardflow-cl" + ep]),
        }
        summary["epochs"]["steady_fraction_of_limit_cpu"] = cpu["limit"] / summary["epochs"]["steady_cpu_us_per_sample"]
        # what reading costs on top of decoding, per image: tar, shuffle, batching, IPC, the main process
        summary["epochs"]["steady_overhead_us"] = summary["epochs"]["steady_cpu_us_per_sample"] - cpu["limit"]
        summary["epochs"]["steady_overhead_us_cl"] = summary["epochs"]["steady_cpu_us_per_sample_cl"] - cpu["limit-hwc"]
    pr = summary["per_round_median"]
    print(f"\nshardflow: {summary['ratio_vs_webdataset']:.2f}x webdataset, "
          f"{100 * summary['fraction_of_limit']:.1f}% of the decode limit "
          f"({100 * summary['fraction_of_limit_cpu']:.1f}% by CPU time per image), first batch "
          f"{first['shardflow'] * 1000:.0f} ms vs {first['webdataset'] * 1000:.0f} ms")
    print(f"per-round medians: {pr['shardflow/webdataset']:.2f}x webdataset, "
          f"{100 * pr['shardflow/limit']:.1f}% of the limit; channels_last "
          f"{100 * pr['shardflow-cl/limit-hwc']:.1f}% of the HWC decode limit")
    if args.epochs > 0:
        e = summary["epochs"]
        print(f"one Loader over {args.epochs} epochs (what training runs): {100 * e['fraction_of_limit']:.1f}% of the "
              f"decode limit in its best epoch after the first ({100 * e['per_round_median']:.1f}% per-round median; "
              f"{100 * e['fraction_of_limit_cpu']:.1f}% by CPU per image over all epochs, start-up included); "
              f"channels_last {100 * e['channels_last_fraction_of_hwc_limit']:.1f}% of the HWC decode limit")
        print(f"  its epochs after the first: {e['steady_cpu_us_per_sample']:.0f} us of CPU per image "
              f"({100 * e['steady_fraction_of_limit_cpu']:.1f}% of the limit by CPU), channels_last "
              f"{e['steady_cpu_us_per_sample_cl']:.0f} us; reading costs {e['steady_overhead_us']:.0f} us per image "
              f"on top of the decode ({e['steady_overhead_us_cl']:.0f} us channels_last, over the HWC decode)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
