"""Record streams vs tar for tiny samples: write and read samples/s, and bytes on disk.

Samples of ~80 bytes (a key, a short caption, a class label) are where tar's 512-byte header and
512-byte padding per member cost most. Each format writes the same samples through ShardWriter
(atomic, hashed, one shard) and reads them back with read_samples, best of `--rounds` rounds,
side by side in one process so the ratios hold on a loaded machine.

Run: python bench/bench_records.py [--samples 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

from shardflow import ShardWriter, read_samples

FORMATS = (".tar", ".cbors", ".mps")


def tiny_samples(n: int) -> list[dict]:
    """~80 bytes each: a 9-byte key, a 70-byte caption and a class label."""
    caption = "a photo of object number {:09d} on a plain wooden table, photographed"
    return [{"__key__": f"{i:09d}", "txt": caption.format(i).encode()[:70], "cls": str(i % 1000).encode()}
            for i in range(n)]


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(folder: str, suffix: str, samples: list[dict], rounds: int) -> dict:
    url = os.path.join(folder, f"bench-%06d{suffix}")

    def write() -> None:
        with ShardWriter(url, maxcount=len(samples) + 1, fsync=False) as w:
            for s in samples:
                w.write(s)

    def read() -> None:
        count = sum(1 for _ in read_samples(url % 0))
        assert count == len(samples)

    t_write = best(write, rounds)
    t_read = best(read, rounds)
    return {"format": suffix, "write": len(samples) / t_write, "read": len(samples) / t_read,
            "bytes": os.path.getsize(url % 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    samples = tiny_samples(args.samples)
    payload = sum(len(s["__key__"]) + len(s["txt"]) + len(s["cls"]) for s in samples) / len(samples)
    print(f"{args.samples} samples, {payload:.0f} B of key + payload each; python {platform.python_version()}")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for suffix in FORMATS:
            rows.append(measure(folder, suffix, samples, args.rounds))
    tar = rows[0]
    print(f"{'format':<8} {'write/s':>10} {'read/s':>10} {'bytes':>12} {'B/sample':>9}  vs tar: write  read  size")
    for r in rows:
        print(f"{r['format']:<8} {r['write']:>10.0f} {r['read']:>10.0f} {r['bytes']:>12} "
              f"{r['bytes'] / args.samples:>9.0f}  {r['write'] / tar['write']:>12.2f}x "
              f"{r['read'] / tar['read']:>4.2f}x {r['bytes'] / tar['bytes']:>5.3f}")


if __name__ == "__main__":
    main()
