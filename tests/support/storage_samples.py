"""Sample and shard helpers shared by the object-store tests (test_contract.py, test_s3.py, test_gcs.py)."""

from __future__ import annotations

import random

from shardflow.shards.writer import TarWriter


def make_samples(n: int, size: int, seed: int = 0, prefix: str = "k") -> list[dict]:
    """n samples of `size` random bytes plus a cls, with keys `{prefix}/000000`..."""
    rnd = random.Random(seed)
    return [{"__key__": f"{prefix}/{i:06d}", "bin": rnd.randbytes(size), "cls": b"%d" % i} for i in range(n)]


def strip_url(sample: dict) -> dict:
    """The sample without `__url__`, to compare what was written with what was read."""
    return {k: v for k, v in sample.items() if k != "__url__"}


def write_shard(url: str, samples: list[dict], options: dict) -> TarWriter:
    """Write `samples` into one shard at `url`; returns the closed writer."""
    with TarWriter(url, storage_options=options) as writer:
        for sample in samples:
            writer.write(sample)
    return writer
