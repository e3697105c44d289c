"""Shard I/O benchmark: read + re-write shards WITHOUT decoding, shardflow vs webdataset vs `cat`.

Same input shards, same output directory, one run:

  shardflow   for each input shard: read_samples(url) -> ShardWriter(out-%06d.tar, maxcount=n)
              (the default path: sha256 receipt per shard, fsync + atomic rename on commit)
  webdataset  wds.tarfile_to_samples() over the same URLs -> wds.ShardWriter(maxcount=n,
              encoder=False) (its fastest path: no encoding, no checksum, no fsync)
  cat         `cat in > out` per shard (the raw copy limit of this machine: no parsing at all)

on two datasets:

  large   --large-shards shards x --large-samples samples of ~60 KB (random bytes, JPEG-sized,
          sizes vary 40-80 KB) + a small `cls` member
  small   --small-shards shards x --small-samples samples of ~100 bytes (`txt` ~97 B + `cls`)

Each method runs --repeat times, interleaved, and the best run is kept (2 cores, shared machine);
the spread (best..median) is printed too. Inputs are read from the page cache in every run.

Then peak memory: a subprocess streams one shard of --mem-sample-mb MB samples through
read_samples -> ShardWriter (and, for comparison, webdataset's reader -> TarWriter) and reports
its peak RSS (VmHWM from /proc/self/status) above its RSS before the first sample, for a shard of
--mem-gb GB and for one a quarter that size: it must stay near one sample and not grow with the
shard.

    python bench/bench_io.py                      # full run (~2.6 GB of temp data at peak)
    python bench/bench_io.py --quick              # small smoke run
    python bench/bench_io.py --json out.json      # figures as JSON too

Data lives under a temp dir (--tmp, default: the system temp dir) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from shardflow import ShardWriter, TarWriter, read_samples  # noqa: E402

MB = 1e6


# ------------------------------------------------------------------------------------- data


def make_dataset(directory: str, nshards: int, nsamples: int, size_fn, seed: int) -> list[str]:
    """Write nshards shards of nsamples samples each; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    urls = []
    for s in range(nshards):
        url = os.path.join(directory, f"in-{s:06d}.tar")
        with TarWriter(url, checksum=None) as w:
            for i in range(nsamples):
                n = size_fn(rng)
                w.write({"__key__": f"{s:04d}/{i:08d}", "cls": b"%d" % (i % 1000), "data.bin": rng.bytes(n)})
        urls.append(url)
    return urls


def large_size(rng) -> int:
    return int(rng.integers(40_000, 80_000))


def small_size(rng) -> int:
    return int(rng.integers(90, 105))


def total_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def warm(paths) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


# ------------------------------------------------------------------------------------- methods


def _shardflow(urls: list[str], out: str, per_shard: int, **options) -> int:
    n = 0
    with ShardWriter(os.path.join(out, "out-%06d.tar"), maxcount=per_shard, maxsize=1e12, **options) as w:
        for url in urls:
            for sample in read_samples(url):
                w.write(sample)
                n += 1
    return n


def run_shardflow(urls, out, per_shard):  # the default: sha256 receipts, fsync + rename on commit
    return _shardflow(urls, out, per_shard)


def run_shardflow_nofsync(urls, out, per_shard):  # what cat does: leave the data in the page cache
    return _shardflow(urls, out, per_shard, fsync=False)


def run_shardflow_nofsync_nosha(urls, out, per_shard):  # no receipt checksum either
    return _shardflow(urls, out, per_shard, fsync=False, checksum=None)


def run_webdataset(urls: list[str], out: str, per_shard: int) -> int:
    import webdataset as wds

    n = 0
    source = wds.tarfile_to_samples()([{"url": u} for u in urls])
    with wds.ShardWriter(os.path.join(out, "out-%06d.tar"), maxcount=per_shard, maxsize=1e12,
                         verbose=0, encoder=False) as w:
        for sample in source:
            w.write(sample)
            n += 1
    return n


def run_cat(urls: list[str], out: str, per_shard: int, fsync: bool = False) -> int:
    for i, url in enumerate(urls):
        with open(os.path.join(out, f"out-{i:06d}.tar"), "wb") as dst:
            subprocess.run(["cat", url], stdout=dst, check=True)
            if fsync:
                os.fsync(dst.fileno())
    return len(urls) * per_shard


def run_cat_fsync(urls, out, per_shard):  # cat with the durability shardflow gives by default
    return run_cat(urls, out, per_shard, fsync=True)


METHODS = {
    "shardflow": run_shardflow,
    "shardflow fsync=False": run_shardflow_nofsync,
    "shardflow fsync=False checksum=None": run_shardflow_nofsync_nosha,
    "webdataset": run_webdataset,
    "cat": run_cat,
    "cat + fsync": run_cat_fsync,
}


def cpu_seconds() -> float:
    """CPU time (user + system) of this process, all threads, and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(urls, per_shard, out_root, repeat, methods) -> dict:
    nbytes = total_bytes(urls)
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpus: dict[str, list[float]] = {m: [] for m in methods}
    nsamples = len(urls) * per_shard
    for _ in range(repeat):
        for name in methods:  # interleaved, so a noisy neighbour hits every method alike
            out = os.path.join(out_root, name)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            gc.collect()
            c0, t0 = cpu_seconds(), time.perf_counter()
            n = METHODS[name](urls, out, per_shard)
            elapsed = time.perf_counter() - t0
            cpus[name].append(cpu_seconds() - c0)
            assert n == nsamples, (name, n, nsamples)
            if name != "cat":
                assert total_bytes(_tars(out)) > 0
            times[name].append(elapsed)
            shutil.rmtree(out, ignore_errors=True)
    result = {"shards": len(urls), "samples": nsamples, "bytes": nbytes, "methods": {}}
    for name, ts in times.items():
        best = min(ts)
        result["methods"][name] = {
            "best_s": best,
            "median_s": statistics.median(ts),
            "samples_per_s": nsamples / best,
            "mb_per_s": nbytes / MB / best,
            "runs_s": ts,
            "cpu_s": min(cpus[name]),
            "mb_per_cpu_s": nbytes / MB / min(cpus[name]),
        }
    return result


def _tars(directory):
    return [os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tar")]


# ------------------------------------------------------------------------------------- memory

_MEM_CHILD = r"""
import os, resource, sys, json
sys.path.insert(0, {root!r})
which, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
if which == "shardflow":
    from shardflow import ShardWriter, read_samples
    base = rss_kb()
    n = 0
    with ShardWriter(dst + "-%06d.tar", maxcount=10**9, maxsize=1e13) as w:
        for sample in read_samples(src):
            w.write(sample)
            n += 1
else:
    import webdataset as wds
    base = rss_kb()
    n = 0
    with wds.TarWriter(dst + "-000000.tar", encoder=False) as w:
        for sample in wds.tarfile_to_samples()([{{"url": src}}]):
            w.write(sample)
            n += 1
def hwm_kb():  # peak RSS of this process image (VmHWM; ru_maxrss would include the parent's at fork)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
print(json.dumps({{"samples": n, "base_kb": base, "peak_kb": hwm_kb(),
                  "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""


def measure_memory(tmp: str, gb: float, sample_mb: float, methods=("shardflow", "webdataset")) -> list[dict]:
    sample_bytes = int(sample_mb * 1e6)
    results = []
    rng = np.random.default_rng(7)
    block = rng.bytes(sample_bytes)
    for frac in (0.25, 1.0):
        n = max(1, int(gb * frac * 1e9 / sample_bytes))
        src = os.path.join(tmp, f"mem-{n}.tar")
        with TarWriter(src, checksum=None) as w:
            for i in range(n):
                # distinct bytes per sample without generating 1 GB of randomness
                w.write({"__key__": f"big/{i:06d}", "bin": i.to_bytes(8, "big") + block[8:]})
        code = _MEM_CHILD.format(root=os.path.dirname(HERE))
        for which in methods:
            dst = os.path.join(tmp, f"mem-out-{which}")
            out = subprocess.run([sys.executable, "-c", code, which, src, dst], capture_output=True, text=True,
                                 check=True)
            info = json.loads(out.stdout)
            info.update(method=which, shard_bytes=os.path.getsize(src), sample_bytes=sample_bytes,
                        growth_mb=(info["peak_kb"] - info["base_kb"]) * 1024 / MB)
            results.append(info)
            for f in os.listdir(tmp):
                if f.startswith(f"mem-out-{which}"):
                    os.unlink(os.path.join(tmp, f))
        os.unlink(src)
    return results


# ------------------------------------------------------------------------------------- report


def report(name: str, res: dict) -> list[str]:
    m = res["methods"]
    lines = [
        f"### {name}: {res['shards']} shards, {res['samples']} samples, {res['bytes'] / MB:.0f} MB",
        "",
        "| method | best s | median s | samples/s | MB/s | vs webdataset | vs cat (MB/s) | CPU s "
        "| vs cat (MB per CPU s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    wds_rate = m.get("webdataset", {}).get("samples_per_s")
    cat_mb = m.get("cat", {}).get("mb_per_s")
    cat_cpu = m.get("cat", {}).get("mb_per_cpu_s")
    for method, r in m.items():
        vs_wds = f"{r['samples_per_s'] / wds_rate:.2f}x" if wds_rate else "-"
        vs_cat = f"{100 * r['mb_per_s'] / cat_mb:.0f}%" if cat_mb else "-"
        vs_cat_cpu = f"{100 * r['mb_per_cpu_s'] / cat_cpu:.0f}%" if cat_cpu else "-"
        lines.append(
            f"| {method} | {r['best_s']:.3f} | {r['median_s']:.3f} | {r['samples_per_s']:,.0f} | "
            f"{r['mb_per_s']:,.0f} | {vs_wds} | {vs_cat} | {r['cpu_s']:.3f} | {vs_cat_cpu} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large-shards", type=int, default=8)
    ap.add_argument("--large-samples", type=int, default=1000)
    ap.add_argument("--small-shards", type=int, default=8)
    ap.add_argument("--small-samples", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mem-gb", type=float, default=1.0)
    ap.add_argument("--mem-sample-mb", type=float, default=10.0)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: " + ", ".join(METHODS))
    ap.add_argument("--datasets", default="large,small")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    ap.add_argument("--tmp", default=None, help="where to put the data (deleted at the end)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.quick:
        args.large_shards, args.large_samples, args.small_shards, args.small_samples = 2, 100, 2, 500
        args.repeat, args.mem_gb = 2, 0.05
    methods = [m for m in args.methods.split(",") if m]

    tmp = tempfile.mkdtemp(prefix="shardflow-bench-io-", dir=args.tmp)
    results: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    try:
        import webdataset

        results["webdataset"] = webdataset.__version__
        lines = []
        for name, nshards, nsamples, size_fn in (
            ("large", args.large_shards, args.large_samples, large_size),
            ("small", args.small_shards, args.small_samples, small_size),
        ):
            if name not in args.datasets.split(","):
                continue
            urls = make_dataset(os.path.join(tmp, name), nshards, nsamples, size_fn, seed=len(name))
            warm(urls)
            res = measure(urls, nsamples, os.path.join(tmp, "out"), args.repeat, methods)
            results[name] = res
            lines += report(f"{name} samples", res) + [""]
            shutil.rmtree(os.path.join(tmp, name))
            print("\n".join(report(f"{name} samples", res)), "\n", flush=True)
        if not args.no_memory:
            mem = measure_memory(tmp, args.mem_gb, args.mem_sample_mb)
            results["memory"] = mem
            mem_lines = [
                f"### peak memory, streaming one shard of {args.mem_sample_mb:g} MB samples (read + re-write)",
                "",
                "| method | shard | samples | RSS before | peak RSS | growth | growth / sample size |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for r in mem:
                mem_lines.append(
                    f"| {r['method']} | {r['shard_bytes'] / 1e9:.2f} GB | {r['samples']} | "
                    f"{r['base_kb'] / 1024:.0f} MiB | {r['peak_kb'] / 1024:.0f} MiB | {r['growth_mb']:.0f} MB | "
                    f"{r['growth_mb'] * MB / r['sample_bytes']:.1f} |"
                )
            print("\n".join(mem_lines), flush=True)
            lines += mem_lines
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
