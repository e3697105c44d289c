"""Whole-job passthrough speed: ShardJob (defaults) vs webdataset, Python's tarfile and `cat`, one run.

Issue 16 measured shardflow's passthrough of large samples (10 MB) as the slowest of the three tar
tools; this bench reproduces that comparison side by side, interleaved (a new, seeded order each round),
best and median of --repeat (CPU time: median, all processes involved):

  shardflow      ShardJob(identity).run() with its defaults: processes backend, sha256 receipts,
                 fsync + atomic rename, run directory with markers (CPU counts the pool's workers,
                 reaped by the fork server; the fork server starts once, in the first round)
  shardflow serial  the same job in this process (its CPU time is counted)
  webdataset     wds.tarfile_to_samples -> wds.TarWriter(encoder=False) (no checksum, no fsync)
  tarfile        tarfile.open("r|") -> tarfile.open("w") addfile(member, extractfile) copy
  cat            `cat in > out` (the raw copy limit: no parsing at all)
  cat + fsync    the same with the durability shardflow gives by default
  copy + sha256  the floor of any copy with shardflow's receipts and durability, tar aside: 1 MiB
                 reads and writes in this thread, sha256 of each chunk in a second one (hashlib and
                 the system calls release the GIL), writeback started every 8 MiB and fsync at the
                 end (as shardflow's local shards)
  sha256         hashing the input alone, one thread (what a receipt costs by itself)
  parse          shardflow's tar reader alone: read_samples over the shard, nothing written (the least
                 per-sample Python any job pays: headers parsed, members grouped into samples)
  parse + frame  the bound of a job's main thread without the job: read_samples -> TarWriter (sha256 receipt
                 in its thread, fsync, atomic rename), sample by sample, no fn, no encoder, no seeding, no
                 run directory (issue 28 item 3: how close per-sample Python can come to copy + sha256)
  parse + frame xxh3 / parse + frame no hash  the same loop with an xxh3_128 receipt / with no hash at
                 all (what the hash thread's GIL hand-offs cost the loop; no job can skip its receipt)
  shardflow blake3 / xxh3  the shardflow row with checksum="blake3" / "xxh3_128" (the `checksums` extra)
  copy + blake3  the copy floor with a BLAKE3 receipt

    python bench/bench_speed.py --sample-mb 10 --total-mb 1000 --repeat 3
    python bench/bench_speed.py --sample-mb 0.06 --total-mb 500 --repeat 3
    python bench/bench_speed.py --sample-mb 0.06 --total-mb 300 --shards 4   # the job's 2 processes side by side
    python bench/bench_speed.py --sample-mb 10 --total-mb 1000 --fresh   # each run a fresh process, from outside

With --fresh every method runs in a new `python` (its wall time from the call to the end of the method,
CPU of the whole process tree, peak RSS over the RSS after the imports), as measured from outside; without
it, every method runs in this process, where the processes backend's fork server, started in the first
round, serves the later rounds warm.

Inputs are in the page cache (read once before timing); outputs go to --tmp (default: system temp).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
from cpu_time import descendants_cpu, own_cpu  # noqa: E402

import shardflow as sf  # noqa: E402
from shardflow import TarWriter  # noqa: E402
from shardflow.storage.local_files import start_writeback  # noqa: E402


def identity(sample):
    return sample


def make_shard(path: str, sample_bytes: int, total_bytes: int) -> int:
    rng = np.random.default_rng(0)
    n = max(1, total_bytes // sample_bytes)
    with TarWriter(path) as w:
        for i in range(n):
            size = int(sample_bytes * rng.uniform(0.7, 1.3))
            w.write({"__key__": f"s{i:07d}", "bin": rng.bytes(size), "cls": b"%d" % (i % 10)})
    return n


def _inputs(srcs: list[str]) -> str:
    """The job's input spec: the one shard, or a brace range over in-000.tar, in-001.tar, ..."""
    if len(srcs) == 1:
        return srcs[0]
    return os.path.join(os.path.dirname(srcs[0]), "in-{%03d..%03d}.tar" % (0, len(srcs) - 1))


def run_shardflow(srcs: list[str], out: str) -> None:
    sf.ShardJob(identity, inputs=_inputs(srcs), outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run")).run(progress=False)


def run_shardflow_serial(srcs: list[str], out: str) -> None:  # in this process: its CPU time is counted
    sf.ShardJob(identity, inputs=_inputs(srcs), outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run")).run("serial", progress=False)


def run_shardflow_checksum(srcs: list[str], out: str, checksum: str) -> None:  # the default backend
    sf.ShardJob(identity, inputs=_inputs(srcs), outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run"), checksum=checksum).run(progress=False)


def run_webdataset(srcs: list[str], out: str) -> None:
    import webdataset as wds

    for i, src in enumerate(srcs):
        with wds.TarWriter(os.path.join(out, f"o-{i:03d}.tar"), encoder=False) as w:
            for sample in wds.tarfile_to_samples()([{"url": src}]):
                w.write({k: v for k, v in sample.items() if k != "__url__"})


def run_tarfile(srcs: list[str], out: str) -> None:
    for i, src in enumerate(srcs):
        with tarfile.open(src, "r|") as tin, tarfile.open(os.path.join(out, f"o-{i:03d}.tar"), "w") as tout:
            for member in tin:
                tout.addfile(member, tin.extractfile(member))


def run_cat(srcs: list[str], out: str, fsync: bool = False) -> None:
    for i, src in enumerate(srcs):
        with open(os.path.join(out, f"o-{i:03d}.tar"), "wb") as dst:
            subprocess.run(["cat", src], stdout=dst, check=True)
            if fsync:
                os.fsync(dst.fileno())


def run_copy_sha256(srcs: list[str], out: str, checksum: str = "sha256") -> None:
    from shardflow.shards.checksums import new_hasher

    for i, src in enumerate(srcs):
        digest = new_hasher(checksum)
        inflight: deque = deque()
        with ThreadPoolExecutor(1) as hasher, open(src, "rb", buffering=0) as fin, \
                open(os.path.join(out, f"o-{i:03d}.tar"), "wb", buffering=0) as fout:
            written = kicked = 0
            while chunk := fin.read(1 << 20):
                inflight.append(hasher.submit(digest.update, chunk))  # one thread: hashed in order
                written += fout.write(chunk)
                if written - kicked >= 8 << 20:
                    start_writeback(fout.fileno(), kicked, written - kicked)
                    kicked = written
                if len(inflight) > 8:  # at most ~8 MiB waiting for the hash, as shardflow's sink
                    inflight.popleft().result()
            for pending in inflight:
                pending.result()
            os.fsync(fout.fileno())
        digest.hexdigest()


def run_parse(srcs: list[str], out: str) -> None:
    for src in srcs:
        for _ in sf.read_samples(src):
            pass


def run_parse_frame(srcs: list[str], out: str, checksum: str | None = "sha256") -> None:
    from shardflow.shards.samples import sample_members

    for i, src in enumerate(srcs):
        with TarWriter(os.path.join(out, f"o-{i:03d}.tar"), checksum=checksum) as w:
            for sample in sf.read_samples(src):
                w.write_members(sample_members(sample))


def run_sha256(srcs: list[str], out: str) -> None:
    for src in srcs:
        digest = hashlib.sha256()
        with open(src, "rb", buffering=0) as fin:
            while chunk := fin.read(1 << 20):
                digest.update(chunk)
        digest.hexdigest()


METHODS = {
    "shardflow": run_shardflow,
    "shardflow serial": run_shardflow_serial,
    "webdataset": run_webdataset,
    "tarfile": run_tarfile,
    "cat": run_cat,
    "cat + fsync": lambda srcs, out: run_cat(srcs, out, fsync=True),
    "copy + sha256": run_copy_sha256,
    "shardflow blake3": lambda srcs, out: run_shardflow_checksum(srcs, out, "blake3"),
    "shardflow xxh3": lambda srcs, out: run_shardflow_checksum(srcs, out, "xxh3_128"),
    "copy + blake3": lambda srcs, out: run_copy_sha256(srcs, out, "blake3"),
    "sha256": run_sha256,
    "parse": run_parse,
    "parse + frame": run_parse_frame,
    "parse + frame xxh3": lambda srcs, out: run_parse_frame(srcs, out, "xxh3_128"),
    "parse + frame no hash": lambda srcs, out: run_parse_frame(srcs, out, None),
}


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def run_fresh(name: str, srcs: list[str], out: str, trace_python: bool = False) -> tuple[float, float, float, float]:
    """`name` in a fresh `python` (as a user runs it: imports, the job's start, its end): (wall s of the
    method in it, CPU s of the process tree, peak RSS MB of the process over its RSS after the imports,
    with `trace_python` the peak MB of Python's own allocations in that process (tracemalloc), else -1)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "BENCH_TRACE_PYTHON": "1" if trace_python else "0"}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, out, *srcs],
                          check=True, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    python_peak, wall, rss = map(float, done.stdout.split()[-3:])
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, rss, python_peak


def _child(name: str, out: str, srcs: list[str]) -> None:
    import tracemalloc

    import webdataset  # noqa: F401 - every method's imports made before the base line, so only the run counts

    traced = os.environ.get("BENCH_TRACE_PYTHON") == "1"
    if traced:  # Python's own allocations (slower: the wall time is then not the method's)
        tracemalloc.start()
    base = _vm_kb("VmRSS")
    t0 = time.perf_counter()
    METHODS[name](srcs, out)
    python_peak = tracemalloc.get_traced_memory()[1] / 1e6 if traced else -1.0
    print(python_peak, time.perf_counter() - t0, (_vm_kb("VmHWM") - base) / 1e3)


def cpu() -> float:
    """CPU of this process and of every process it started (cat, the fork server and its workers)."""
    return own_cpu() + descendants_cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample-mb", type=float, default=10)
    ap.add_argument("--total-mb", type=float, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--shards", type=int, default=1,
                    help="split the input into this many shards (the job's processes then work side by side; "
                         "the other methods copy them one after another)")
    ap.add_argument("--fresh", action="store_true",
                    help="run each method in a fresh python process (from outside: start and end counted) "
                         "and report its peak RSS over its imports")
    ap.add_argument("--trace-python", action="store_true",
                    help="with --fresh: also the peak of Python's own allocations (tracemalloc) in that process; "
                         "its speed figures then include tracemalloc's cost")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child[0], args.child[1], args.child[2:])
    root = tempfile.mkdtemp(prefix="sf-speed-", dir=args.tmp)
    try:
        srcs = [os.path.join(root, f"in-{i:03d}.tar") for i in range(args.shards)]
        n = sum(make_shard(src, int(args.sample_mb * 1e6), int(args.total_mb * 1e6 / args.shards)) for src in srcs)
        size = sum(os.path.getsize(src) for src in srcs)
        subprocess.run(["cat", *srcs], stdout=subprocess.DEVNULL, check=True)
        methods = args.methods.split(",")
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
        peaks: dict[str, list[float]] = {m: [] for m in methods}
        python_peaks: dict[str, list[float]] = {m: [] for m in methods}
        for round_ in range(args.repeat):
            # a new order every round (seeded): on this shared machine a run's CPU time swings up to
            # 1.7x with what ran just before it (deleting and fsyncing 1 GB leaves kernel work behind);
            # a fixed (or rotated) order charged that to the same method every round
            order = list(methods)
            random.Random(round_).shuffle(order)
            for name in order:
                out = os.path.join(root, "out")
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                subprocess.run(["sync"], check=True)
                if args.fresh:
                    wall, cpu_s, peak, python_peak = run_fresh(name, srcs, out, args.trace_python)
                    times[name].append((wall, cpu_s))
                    peaks[name].append(peak)
                    python_peaks[name].append(python_peak)
                    continue
                c0, t0 = cpu(), time.perf_counter()
                METHODS[name](srcs, out)
                times[name].append((time.perf_counter() - t0, cpu() - c0))
        print(f"{n} samples of ~{args.sample_mb:g} MB, {size / 1e6:.0f} MB in {len(srcs)} shard(s); "
              f"best / median of {args.repeat}; load {os.getloadavg()[0]:.1f}")
        best = {m: size / min(t for t, _ in ts) / 1e6 for m, ts in times.items()}
        for name, ts in times.items():
            med = statistics.median(t for t, _ in ts)
            cpu_s = statistics.median(c for _, c in ts)
            ratios = "  ".join(f"{best[name] / best[o]:.2f}x {o}" for o in methods if o != name)
            peak = f"  peak RSS +{max(peaks[name]):.0f} MB" if peaks[name] else ""
            if args.trace_python and python_peaks[name]:
                peak += f" (Python allocations {max(python_peaks[name]):.1f} MB)"
            print(f"  {name:17s} {best[name]:6.0f} MB/s best {size / med / 1e6:6.0f} median  cpu {cpu_s:5.2f}s"
                  f"{peak}  {ratios}")
        cpu_med = {m: statistics.median(c for _, c in ts) for m, ts in times.items()}
        for name in (m for m in methods if m.startswith("shardflow")):
            ratios = "  ".join(f"{cpu_med[o] / cpu_med[name]:.2f}x {o}" for o in methods if o != name)
            print(f"  by CPU time (theirs / ours): {name:17s} {ratios}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
