"""Who reads what: splitting one epoch's samples across ranks and DataLoader workers.

Pure Python (no torch), so the rules can be checked without starting processes. Everything here is
a function of integers only (seed, epoch, rank, worker, counts): every process computes the same
split on its own, with no communication, and a rerun computes it again identically.

Vocabulary:
- *consumer*: one (rank, worker) pair that yields samples; there are `world * workers` of them.
- *global sequence*: the epoch's samples in shard order (the shard order is shuffled per epoch from
  (seed, epoch) only, so it is the same on every rank).

Two ways to split, chosen by what is known:

- **counts known** (a manifest gives every shard's `nsamples`): each rank takes a contiguous range of
  the global sequence, and each worker a contiguous, whole-batch part of its rank's range. Counts per
  rank differ by at most one sample (equal with `equalize`), the number of batches a rank yields does
  not depend on its number of workers, and shards are split inside when there are fewer shards than
  consumers (a consumer reads only up to the end of its range).
- **counts unknown**: shards are dealt to consumers round-robin. With fewer shards than consumers each
  shard is read by `k = ceil(consumers / shards)` consumers, each keeping every k-th sample.

Either way, every sample of the epoch goes to exactly one consumer (unless `equalize`/`epoch_size` ask
for fixed counts, which drop or repeat a few samples). A consumer with a fixed count (a quota) that its
part does not fill (map= dropped samples, a damaged shard) reads refill passes: its own part again,
then the rest of the epoch's samples (Assignment.refill), so that a worker whose whole part was
dropped still fills its quota and every rank yields the same number of batches.

With counts and `epoch_size`, epoch e reads the e-th window of an endless sequence of passes over all
samples (pass_segments): consecutive epochs cover every sample once before any repeats, whatever the
epoch size.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from dataclasses import dataclass
from typing import Iterator, Sequence

EQUALIZE = (None, "drop", "pad")

# Domain tags keep the streams of random numbers for different purposes independent.
TAG_SHARD_ORDER = 0x5348
TAG_BUFFER = 0x4255
TAG_RESAMPLE = 0x5253
TAG_REFILL = 0x5246


def mix(*values: int) -> int:
    """A 64-bit seed from integers: stable across processes, machines and Python versions.

    (Python's `hash()` is salted per process for str/bytes, so it must never seed anything here.)
    """
    h = hashlib.blake2b(digest_size=8, person=b"shardflow-split")
    for v in values:
        h.update((int(v) % (1 << 128)).to_bytes(16, "little"))
    return int.from_bytes(h.digest(), "little")


def rng_for(*values: int) -> random.Random:
    return random.Random(mix(*values))


@dataclass(frozen=True)
class Consumer:
    """One (rank, worker) pair; `workers` is the number of DataLoader workers per rank (>= 1)."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world and 0 <= self.worker < self.workers):
            raise ValueError(f"bad consumer {self}")

    @property
    def index(self) -> int:
        return self.rank * self.workers + self.worker

    @property
    def count(self) -> int:
        return self.world * self.workers


@dataclass(frozen=True)
class Segment:
    """Samples `i` of shard number `shard` with `start <= i < stop` (stop None: to the end) and
    `i % step == phase`; `i` counts the samples the shard yields, in order."""

    shard: int
    start: int = 0
    stop: int | None = None
    step: int = 1
    phase: int = 0

    def take(self, i: int) -> bool:
        return i >= self.start and (self.step == 1 or i % self.step == self.phase)


@dataclass(frozen=True)
class Assignment:
    """What one consumer reads in one epoch."""

    segments: tuple[Segment, ...]
    quota: int | None  # exactly this many samples (stop early / repeat to reach it); None: all
    expected: int | None  # samples the segments hold by the counts (None: unknown)
    split_inside: bool  # fewer shards than consumers: shards are shared between consumers
    # with a quota: what a refill pass reads after the consumer's own segments again, every other
    # sample of the epoch once (stream.EpochStream's passes); () without a quota
    refill: tuple[Segment, ...] = ()


def shard_order(nshards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard order, identical on every rank and worker."""
    order = list(range(nshards))
    if shuffle:
        rng_for(seed, epoch, TAG_SHARD_ORDER).shuffle(order)
    return order


def rank_range(total: int, world: int, rank: int, equalize: str | None, epoch_size: int | None) -> tuple[int, int]:
    """(start, length) of a rank's part of the global sequence; positions wrap modulo `total`.

    Natural split: ranks get `total // world` or one more. `equalize="drop"` gives every rank the
    smaller count, `"pad"` the larger (the extra position repeats the next rank's first sample).
    `epoch_size` (samples per epoch over all ranks) fixes the count to `epoch_size // world` (`"pad"`:
    rounded up), repeating or leaving out samples as needed.
    """
    if equalize not in EQUALIZE:
        raise ValueError(f"equalize must be one of {EQUALIZE}, got {equalize!r}")
    start = rank * total // world
    if epoch_size is not None:
        length = -(-epoch_size // world) if equalize == "pad" else epoch_size // world
    elif equalize == "drop":
        length = total // world
    elif equalize == "pad":
        length = -(-total // world)
    else:
        length = (rank + 1) * total // world - start
    return start, length


def rank_quota(world: int, equalize: str | None, epoch_size: int | None) -> int | None:
    """Samples per rank when fixed by `epoch_size` alone (no counts known), else None."""
    if epoch_size is None:
        return None
    return -(-epoch_size // world) if equalize == "pad" else epoch_size // world


def batch_count(nsamples: int, batch_size: int | None, partial: bool) -> int:
    b = batch_size or 1
    return -(-nsamples // b) if partial else nsamples // b


def worker_part(nsamples: int, workers: int, worker: int, batch_size: int | None, partial: bool) -> tuple[int, int]:
    """[a, b) of a rank's `nsamples` that `worker` yields: whole batches, contiguous.

    Splitting by batches (not samples) makes a rank's number of batches `batch_count(nsamples)`
    whatever its number of workers, so ranks with equal counts always yield equal numbers of batches.
    """
    b = batch_size or 1
    nb = batch_count(nsamples, batch_size, partial)
    used = nsamples if partial else nb * b
    lo, hi = worker * nb // workers, (worker + 1) * nb // workers
    return min(lo * b, used), min(hi * b, used)


def _ranges_to_segments(lo: int, hi: int, order: Sequence[int], counts: Sequence[int]) -> list[Segment]:
    """Segments covering global positions [lo, hi) (modulo the total) of shards in `order`."""
    sizes = [counts[s] for s in order]
    cum = [0]
    for n in sizes:
        cum.append(cum[-1] + n)
    total = cum[-1]
    segments: list[Segment] = []
    p = lo
    while p < hi and total > 0:
        q = p % total
        j = bisect.bisect_right(cum, q) - 1
        while sizes[j] == 0:  # empty shards hold no positions
            j += 1
        start = q - cum[j]
        take = min(hi - p, sizes[j] - start)
        stop = start + take
        segments.append(Segment(order[j], start, stop))
        p += take
    return segments


def pass_segments(lo: int, hi: int, counts: Sequence[int], seed: int, shardshuffle: bool) -> list[Segment]:
    """Segments of positions [lo, hi) of an endless sequence of passes over all samples: pass p holds
    every sample once, its shards in shard_order(..., p, ...). A fixed epoch size (epoch_size=, a
    collection's quota) reads consecutive windows of it, so every sample comes once before any repeats;
    with windows of one pass each, window p is exactly epoch p's natural order."""
    total = sum(counts)
    segments: list[Segment] = []
    p = lo
    while p < hi and total > 0:
        n = p // total
        end = min(hi, (n + 1) * total)
        order = shard_order(len(counts), seed, n, shardshuffle)
        segments.extend(_ranges_to_segments(p - n * total, end - n * total, order, counts))
        p = end
    return segments


def rest_of_pass(lo: int, hi: int, counts: Sequence[int], seed: int, shardshuffle: bool) -> list[Segment]:
    """What a refill reads after the window [lo, hi) of pass_segments' sequence: the rest of the pass
    that `lo` falls in, from `hi` round to `lo`, in that pass's shard order (the window and its rest
    hold every sample once). Empty when the window covers a whole pass."""
    total = sum(counts)
    if total == 0:
        return []
    order = shard_order(len(counts), seed, lo // total, shardshuffle)
    return _ranges_to_segments(hi, lo + total, order, counts)


def round_robin(nshards: int, consumer: Consumer, seed: int, epoch: int,
                shardshuffle: bool) -> tuple[tuple[Segment, ...], tuple[Segment, ...]]:
    """(the consumer's units, the other consumers' units) when counts are unknown: shards dealt to
    consumers round-robin (each read by k = ceil(consumers / shards) of them, every k-th sample); the
    others' units, in round-robin order from the one after the consumer's first, are its refill."""
    order = shard_order(nshards, seed, epoch, shardshuffle)
    n_consumers = consumer.count
    k = max(1, -(-n_consumers // nshards))
    units = [Segment(s, 0, None, k, j) for j in range(k) for s in order]
    at = consumer.index
    others = tuple(units[(at + j) % len(units)] for j in range(1, len(units))
                   if (at + j) % len(units) % n_consumers != at)
    return tuple(units[at::n_consumers]), others


def assign(
    nshards: int,
    consumer: Consumer,
    *,
    counts: Sequence[int] | None,
    seed: int,
    epoch: int,
    shardshuffle: bool,
    equalize: str | None = None,
    epoch_size: int | None = None,
    batch_size: int | None = None,
    partial: bool = True,
) -> Assignment:
    """The segments (and sample quota) of `consumer` for `epoch` (not resampled)."""
    order = shard_order(nshards, seed, epoch, shardshuffle)
    fixed = equalize is not None or epoch_size is not None
    if counts is not None:
        total = sum(counts)
        nonempty = sum(1 for n in counts if n > 0)
        start, length = rank_range(total, consumer.world, consumer.rank, equalize, epoch_size)
        a, b = worker_part(length, consumer.workers, consumer.worker, batch_size, partial)
        refill: list[Segment] = []
        if epoch_size is None:
            segments = _ranges_to_segments(start + a, start + b, order, counts) if b > a else []
            if fixed and b > a:  # the rest of the epoch's sequence, from the end of this part round to it
                refill = _ranges_to_segments(start + b, start + a + total, order, counts)
        else:  # epochs tile an endless sequence of passes: every sample once before any repeats
            base = (epoch * consumer.world + consumer.rank) * length
            segments = pass_segments(base + a, base + b, counts, seed, shardshuffle) if b > a else []
            if b > a:  # the rest of the pass this part starts in, in that pass's order
                refill = rest_of_pass(base + a, base + b, counts, seed, shardshuffle)
        return Assignment(tuple(segments), b - a if fixed else None, b - a, nonempty < consumer.count,
                          tuple(refill))
    if equalize is not None and epoch_size is None:
        raise ValueError(
            "equalize= needs known sample counts: pass manifest= (a job's run directory or its "
            "summary.json) or epoch_size="
        )
    mine, others = round_robin(nshards, consumer, seed, epoch, shardshuffle)
    quota = None
    refill: tuple[Segment, ...] = ()
    if epoch_size is not None:
        per_rank = rank_quota(consumer.world, equalize, epoch_size)
        a, b = worker_part(per_rank, consumer.workers, consumer.worker, batch_size, partial)
        quota = b - a
        refill = others
    return Assignment(mine, quota, quota, nshards < consumer.count, refill)


def rank_length(
    counts: Sequence[int] | None,
    world: int,
    rank: int,
    *,
    equalize: str | None,
    epoch_size: int | None,
    batch_size: int | None,
    partial: bool,
) -> int | None:
    """Items (batches when batch_size is set, else samples) a rank yields per epoch; None if unknown."""
    if counts is not None:
        _, n = rank_range(sum(counts), world, rank, equalize, epoch_size)
    elif epoch_size is not None:
        n = rank_quota(world, equalize, epoch_size)
    else:
        return None
    return batch_count(n, batch_size, partial) if batch_size else n


def resampled_shards(nshards: int, counts: Sequence[int] | None, rng: random.Random) -> Iterator[int]:
    """Shard numbers drawn with replacement, forever; weighted by sample count when known."""
    if counts is not None and sum(counts) > 0:
        cum = []
        acc = 0
        for n in counts:
            acc += n
            cum.append(acc)
        while True:
            yield bisect.bisect_right(cum, rng.randrange(acc))
    while True:
        yield rng.randrange(nshards)


__all__ = [
    "Assignment", "Consumer", "Segment", "assign", "batch_count", "mix", "pass_segments", "rank_length", "rank_range",
    "resampled_shards", "rest_of_pass", "rng_for", "round_robin", "shard_order", "worker_part",
]
