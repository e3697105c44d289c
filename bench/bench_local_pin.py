"""What pinning local inputs costs (issue 12, item 15): read_samples over a local shard opened plainly
(`open`) and through shardflow's `open_read` (fstat after every 1 MiB read), alternating.

    PYTHONPATH=. .venv/bin/python bench/bench_local_pin.py [--mib 128] [--repeat 3] [--tmp /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from shardflow import TarWriter, open_read, read_samples


def _run(opener, path: str, count: int) -> float:
    """CPU seconds of one pass (CPU time: the machine these ran on was shared, wall time was noise)."""
    started = time.process_time()
    with opener() as f:
        n = sum(1 for _ in read_samples(f, path))
    assert n == count
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tmp", default=tempfile.gettempdir())
    args = parser.parse_args()
    count = args.mib * 16  # 64 KiB samples
    with tempfile.TemporaryDirectory(dir=args.tmp) as folder:
        path = os.path.join(folder, "shard.tar")
        with TarWriter(path) as writer:
            for i in range(count):
                writer.write({"__key__": f"k{i:06d}", "bin": os.urandom(64 << 10)})
        plain, pinned = [], []
        for _ in range(args.repeat):
            plain.append(_run(lambda: open(path, "rb", buffering=1 << 20), path, count))
            pinned.append(_run(lambda: open_read(path), path, count))
    print(f"{args.mib} MiB, {count} samples, best CPU time of {args.repeat}: plain {min(plain):.3f} s, "
          f"pinned {min(pinned):.3f} s, pinned/plain {min(pinned) / min(plain):.3f}")


if __name__ == "__main__":
    main()
