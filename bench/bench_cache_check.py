"""What the reader cache's version check costs per shard open (reader/cache.py: a cached copy is used only
while the remote object's version, storage.sources.object_identity, is the one it copies).

Cache hits with the check (a stat locally, an info()/HEAD on S3) against the same hits with the check
replaced by a constant (the cost before the check existed), several repetitions in rotated order,
medians; then one read of the 64 MiB object on the S3 server for scale. The S3 part starts the test
suite's SeaweedFS (`.venv/bin/weed`) on 127.0.0.1 and stops it.

    .venv/bin/python bench/bench_cache_check.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shardflow.reader.cache import ShardCache  # noqa: E402
from shardflow.storage.schemes import open_read  # noqa: E402
from shardflow.storage.sources import object_version  # noqa: E402


def opens_per_s(cache: ShardCache, url: str, open_remote: Callable[[], Any], version: Callable[[], Any],
                n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        cache.open(url, open_remote, version=version).close()
    return n / (time.perf_counter() - started)


def compare(label: str, cache: ShardCache, url: str, open_remote: Callable[[], Any], check: Callable[[], Any],
            n: int, reps: int) -> float:
    """Opens/s of cache hits with and without the check; the check's cost per open in ms."""
    constant = check()
    first = cache.open(url, open_remote, version=check)  # fill the cache
    first.read()
    first.finish()
    runs: dict[str, list[float]] = {"with check": [], "without": []}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            runs[name].append(opens_per_s(cache, url, open_remote, check if name == "with check" else
                                          (lambda: constant), n))
    median = {name: statistics.median(values) for name, values in runs.items()}
    per_open_ms = (1 / median["with check"] - 1 / median["without"]) * 1e3
    print(f"{label}: {median['with check']:.0f} opens/s with the check, {median['without']:.0f} without; "
          f"the check costs {per_open_ms:.3f} ms per open")
    return per_open_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    shard = tmp / "s-000.tar"
    shard.write_bytes(os.urandom(1 << 20))
    compare("local file (a stat)", ShardCache(str(tmp / "cache"), "1GB"), "s3://x/s-000.tar",
            lambda: open(shard, "rb"), lambda: object_version(str(shard)), 2000, args.reps)

    from tests.support.processes import _find_executable
    from tests.support.s3 import S3Server

    server = S3Server(tmp / "weed", _find_executable("weed"))
    server.start()
    try:
        url = f"{server.make_bucket('benchcache')}/s-000.tar"
        options = server.storage_options
        server.filesystem().pipe(url, os.urandom(64 << 20))
        per_open = compare("S3 test server (a HEAD)", ShardCache(str(tmp / "cache2"), "1GB"), url,
                           lambda: open_read(url, options), lambda: object_version(url, options), 200, args.reps)
        started = time.perf_counter()
        with open_read(url, options) as stream:
            while stream.read(8 << 20):
                pass
        read_ms = (time.perf_counter() - started) * 1e3
        print(f"S3: one read of the 64 MiB object takes {read_ms:.0f} ms: the check adds "
              f"{per_open / read_ms * 100:.2f}% to it")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
