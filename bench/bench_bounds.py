"""What the ~60 KB passthrough could gain without its framing, or without its receipt hash: bounds,
measured before building either (issue 16 suggested a raw passthrough that copies unchanged members'
tar bytes without re-framing them; a cheaper receipt hash than sha256 is the other lever).

It runs the serial ShardJob(identity) on one shard three ways, alternating:

  framed   the job as it is: each member gets a fresh header, small members are joined into ~1 MiB
           pieces for the sink (hashing and writing threads)
  bound    the same job, but each shard writer skips all framing: it adds up the members' tar sizes
           and hands the sink ~1 MiB views of one contiguous buffer, as a raw passthrough would hand
           views of its input chunks (no header, no join, no copy). The output is not a valid tar;
           what is timed is an upper bound: a real raw path would also check each input header
           against the one shardflow writes, and keep a view per member
  no hash  the job as it is, but its shards written with no receipt hash at all (checksum=None):
           the bound of any cheaper hash (blake3, xxh3)

Reported: wall seconds (best and median), CPU seconds of the process and of its main thread, and the
best runs against `cat` of the same shard.

    python bench/bench_bounds.py --sample-mb 0.06 --total-mb 300 --repeat 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench_speed import identity, make_shard, run_cat  # noqa: E402

import shardflow as sf  # noqa: E402
from shardflow.shards import writer as shard_writer  # noqa: E402
from shardflow.shards.tar_write import TarStreamWriter  # noqa: E402

_PIECE = 1 << 20


def unframed_write_members(source: memoryview):
    """A TarWriter.write_members that hands the sink views of `source` instead of framed members."""

    def write_members(self, members: list[tuple[str, bytes]]) -> int:
        state = self.__dict__.setdefault("_bound", [0, 0])  # [bytes added, bytes handed to the sink]
        size = 0
        for name, data in members:
            size += TarStreamWriter.member_size(name, len(data))
        state[0] += size
        self._tar.bytes_written += size
        if state[0] - state[1] >= _PIECE:
            self._sink.write_parts([source[state[1] : state[0]]])
            state[1] = state[0]
        self.nsamples += 1
        return size

    return write_members


def unhashed_init(init):
    """A TarWriter.__init__ that writes with no receipt hash."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["checksum"] = None
        init(self, *args, **kwargs)

    return __init__


def run_once(src: str, root: str) -> tuple[float, float, float]:
    out = os.path.join(root, "out")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    subprocess.run(["sync"], check=True)
    main0, cpu0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
    sf.ShardJob(identity, inputs=src, outputs=os.path.join(out, "{name}.tar"),
                run_dir=os.path.join(out, "_run")).run("serial", progress=False)
    return time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - main0


def _cat_seconds(src: str, root: str) -> float:
    """Wall seconds of bench_speed's `cat` of the shard (the raw copy limit)."""
    out = os.path.join(root, "cat")
    os.makedirs(out)
    try:
        t0 = time.perf_counter()
        run_cat([src], out)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample-mb", type=float, default=0.06)
    ap.add_argument("--total-mb", type=float, default=300)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sf-bounds-", dir=args.tmp)
    framed = shard_writer.TarWriter.write_members
    hashed = shard_writer.TarWriter.__init__
    try:
        src = os.path.join(root, "in.tar")
        n = make_shard(src, int(args.sample_mb * 1e6), int(args.total_mb * 1e6))
        size = os.path.getsize(src)
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
        source = memoryview(os.urandom(size + (64 << 20)))
        variants = {"framed": (framed, hashed), "bound": (unframed_write_members(source), hashed),
                    "no hash": (framed, unhashed_init(hashed))}
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        run_once(src, root)  # warm up: imports, the first run directory
        for _ in range(args.repeat):
            for name, (write_members, init) in variants.items():
                shard_writer.TarWriter.write_members, shard_writer.TarWriter.__init__ = write_members, init
                try:
                    times[name].append(run_once(src, root))
                finally:
                    shard_writer.TarWriter.write_members, shard_writer.TarWriter.__init__ = framed, hashed
        print(f"{n} samples of ~{args.sample_mb:g} MB, {size / 1e6:.0f} MB; serial job, {args.repeat} alternations; "
              f"load {os.getloadavg()[0]:.1f}")
        for name, runs in times.items():
            walls = [w for w, _, _ in runs]
            print(f"  {name:7s} wall best {min(walls):.3f} s ({size / min(walls) / 1e6:5.0f} MB/s), "
                  f"median {statistics.median(walls):.3f} s; CPU {statistics.median(c for _, c, _ in runs):.3f} s, "
                  f"main thread {statistics.median(m for _, _, m in runs):.3f} s")
        framed_wall = statistics.median(w for w, _, _ in times["framed"])
        for name, what in (("bound", "no framing at all"), ("no hash", "no receipt hash at all")):
            gain = framed_wall / statistics.median(w for w, _, _ in times[name])
            print(f"  at most {gain:.2f}x faster (median wall) with {what}")
        cat = min(_cat_seconds(src, root) for _ in range(args.repeat))
        ratios = ", ".join(f"{name} {cat / min(w for w, _, _ in runs):.2f}x" for name, runs in times.items())
        print(f"  cat {size / cat / 1e6:.0f} MB/s; best runs against it: {ratios}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
