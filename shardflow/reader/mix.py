"""Mixing the collections of a dataset spec (shards.spec) into one epoch, deterministically.

Quotas. An epoch takes `q_i` samples of collection i over all ranks:
- with `epoch` (the spec's, or epoch_size=): weights given -> `q_i` proportional to the weights;
  none -> proportional to repeat x sample count (or to repeat alone when counts are unknown);
- without it, counts known: `q_i = round(repeat_i x count_i)`; with weights, the same total split
  by the weights (weights set proportions, the collections' sizes the epoch length);
- counts unknown and no epoch: no quotas; each consumer reads its part of each collection once,
  drawing the next collection by weight among those not exhausted (len() is then unknown).
A `repeat: [lo, hi]` range is drawn once per epoch from (seed, epoch, collection).

Split. Each rank gets `q_i // world` samples of collection i (the same on every rank, so ranks
yield the same number of batches). The rank's sequence of collection labels is a seeded permutation
of that multiset (numpy PCG64 from (seed, epoch, rank)): an exact mix, uniformly interleaved.
Workers take contiguous whole-batch slices of it (split.worker_part), so a rank's number of batches
does not depend on its number of workers. Collection i's samples for a rank are a contiguous range
of the collection's endless sequence of passes (split.pass_segments: each pass every sample once, in
its own shard order; epoch e takes the e-th window of quota-sized windows, so a quota below the
collection's size covers every sample over consecutive epochs before repeating); a worker reads the
sub-range its slice needs. With counts unknown a worker cycles through its round-robin share of the
shards of each collection until its slice is served.

Refill. A consumer whose samples go missing (map= returns None, a damaged shard) still yields its
whole slice, as on the plain path (stream.EpochStream's passes): a refill pass reads its mixed
sequence again, then the rest of the epoch of every collection (split.rest_of_pass: the rest of the
pass its window starts in; counts unknown: the other consumers' round-robin units, split.round_robin),
the next collection drawn by weight among those not exhausted, until the quota is full. So under
quotas every rank yields len(ds) batches; the samples that fill in are read twice in that epoch, and
they change the epoch's exact mix (they come from whatever collections have samples left).

Resume. A consumer's mixed sequence is a function of (seed, epoch, rank, worker, workers, spec) and
it is the raw stream that the state dict counts, so resuming replays the mixer exactly; the spec's
collections, weights and quotas are part of the state's fingerprint.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from shardflow.reader.cache import ShardCache
from shardflow.reader.manifest import ShardManifest
from shardflow.reader.manifest_check import size_checked
from shardflow.reader.settings import ReaderSettings
from shardflow.reader.shard_source import ShardSource
from shardflow.reader.split import (
    Consumer,
    Segment,
    batch_count,
    mix,
    pass_segments,
    rest_of_pass,
    rng_for,
    round_robin,
    worker_part,
)
from shardflow.reader.state import ErrorCount, fingerprint
from shardflow.reader.warn_once import warn_once
from shardflow.shards.records import read_records, record_format
from shardflow.shards.samples import read_samples
from shardflow.shards.spec import Collection, DatasetSpec, SpecError, is_spec, load_spec, spec_json
from shardflow.storage.locate import Locator
from shardflow.storage.specs import expand

TAG_MIX = 0x4D49
TAG_REPEAT = 0x5250


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders; the parts sum to `total`)."""
    s = float(sum(weights))
    exact = [total * w / s for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


@dataclass(frozen=True)
class PartPlan:
    """What one consumer reads of one collection this epoch."""

    segments: tuple[Segment, ...]
    take: int | None  # samples to take (None: the segments once)
    cycle: bool  # go round the segments again until `take` is reached (counts unknown)


@dataclass(frozen=True)
class MixPlan:
    """One consumer's mixed epoch (quacks like layout.EpochPlan for stream.EpochStream)."""

    consumer: Consumer
    epoch: int
    quota: int | None
    labels: Any  # numpy array of collection numbers, in delivery order (None: weighted draws)
    parts: tuple[PartPlan, ...]
    rest: tuple[PartPlan, ...] = ()  # each collection's rest of the epoch: what a refill reads next
    assignment: None = None

    @property
    def resampled(self) -> bool:
        return False  # a quota short after one pass (samples dropped) is refilled (stream.EpochStream)

    def refill_plan(self) -> MixPlan | None:
        """What a refill pass reads after this plan again: the rest of every collection's epoch, mixed
        by weight (no labels); None when nothing is left beyond the consumer's own samples."""
        if not any(part.segments for part in self.rest):
            return None
        return MixPlan(self.consumer, self.epoch, None, None, self.rest)


@dataclass(frozen=True)
class DatasetMix:
    """A loaded spec with each collection's manifest: what ShardDataset needs to mix it."""

    spec: DatasetSpec
    manifests: tuple[ShardManifest, ...]

    @classmethod
    def load(cls, spec: Any, storage_options: Any, manifest: Any) -> DatasetMix:
        loaded = load_spec(spec, storage_options)
        cache: dict = {}  # one read and index per summary.json, however many collections share it
        manifests = tuple(ShardManifest.load(manifest, c.urls, storage_options, cache) for c in loaded.collections)
        return cls(loaded, manifests)

    @property
    def collections(self) -> tuple[Collection, ...]:
        return self.spec.collections

    @property
    def urls(self) -> list[str]:
        return self.spec.urls

    def manifest(self) -> ShardManifest:
        """One manifest over all collections' shards (counts only when every collection has them)."""
        ms = self.manifests
        if any(m.counts is None for m in ms):
            return ShardManifest(None, None, None, None)
        cat = lambda name: [x for m in ms for x in (getattr(m, name) or [None] * len(m.counts))]  # noqa: E731
        return ShardManifest(", ".join(str(m.source) for m in ms), cat("counts"), cat("nbytes"), cat("sha256"))

    def fingerprint_text(self) -> str:
        return spec_json(self.spec)

    def check(self, settings: ReaderSettings) -> None:
        if settings.resampled or settings.equalize is not None:
            raise SpecError(f"spec {self.spec.source}: resampled= and equalize= do not apply to a mixed spec "
                            "(its quotas already give every rank the same count)")
        if settings.epoch_size is None and self.quotas(settings, 0) is None:
            ranged = [c for c in self.collections if c.repeat != (1.0, 1.0)]
            if ranged:
                warn_once(f"spec {self.spec.source}: 'repeat' ({ranged[0].where}) has no effect: its collections' "
                          "sample counts are unknown and it gives no 'epoch:', so each collection is read once; "
                          "run `shardflow index SPEC` (counts) or give 'epoch:' / epoch_size=", stacklevel=5)

    # -- quotas ----------------------------------------------------------------------------------

    def repeats(self, seed: int, epoch: int) -> list[float]:
        out = []
        for i, c in enumerate(self.collections):
            lo, hi = c.repeat
            out.append(lo if lo == hi else lo + (hi - lo) * rng_for(seed, epoch, TAG_REPEAT, i).random())
        return out

    def quotas(self, settings: ReaderSettings, epoch: int) -> list[int] | None:
        """Samples of each collection in `epoch` over all ranks; None: no quotas (see module doc)."""
        counts = [None if m.counts is None else sum(m.counts) for m in self.manifests]
        repeats = self.repeats(settings.seed, epoch)
        weighted = any(c.weight is not None for c in self.collections)
        weights = [c.weight if c.weight is not None else 1.0 for c in self.collections]
        total = settings.epoch_size if settings.epoch_size is not None else self.spec.epoch
        known = all(n is not None for n in counts)
        if total is None:
            if not known:
                return None
            natural = [round(r * n) for r, n in zip(repeats, counts)]  # type: ignore[operator]
            return apportion(sum(natural), weights) if weighted else natural
        if weighted:
            return apportion(total, weights)
        return apportion(total, [r * n for r, n in zip(repeats, counts)] if known else repeats)  # type: ignore[misc]

    def rank_total(self, settings: ReaderSettings, world: int, epoch: int) -> int | None:
        quotas = self.quotas(settings, epoch)
        return None if quotas is None else sum(q // world for q in quotas)

    def length(self, settings: ReaderSettings, world: int, epoch: int) -> int:
        """Items (batches when batch_size is set) a rank yields in `epoch`."""
        n = self.rank_total(settings, world, epoch)
        if n is None:
            raise TypeError(f"len() of this ShardDataset is unknown: spec {self.spec.source} has collections "
                            "without sample counts (no summary.json) and no 'epoch:'; give epoch: or epoch_size=")
        return batch_count(n, settings.batch_size, settings.partial) if settings.batch_size else n

    # -- one consumer's epoch --------------------------------------------------------------------

    def epoch_plan(self, settings: ReaderSettings, actual: Consumer, plan: Consumer, epoch: int) -> MixPlan:
        """What consumer `plan` (the split) reads in `epoch`; `actual` seeds the shuffle buffer."""
        quotas = self.quotas(settings, epoch)
        if quotas is None:
            parts = tuple(PartPlan(self._round_robin(i, settings, plan, epoch)[0], None, False)
                          for i in range(len(self.collections)))
            return MixPlan(actual, epoch, None, None, parts)
        per_rank = [q // plan.world for q in quotas]
        dtype = np.uint8 if len(per_rank) <= 256 else np.int32  # one byte a sample for up to 256 collections
        labels = np.repeat(np.arange(len(per_rank), dtype=dtype), per_rank)
        np.random.Generator(np.random.PCG64(mix(settings.seed, epoch, plan.rank, TAG_MIX))).shuffle(labels)
        a, b = worker_part(len(labels), plan.workers, plan.worker, settings.batch_size, settings.partial)
        before = np.bincount(labels[:a], minlength=len(per_rank))
        mine = np.bincount(labels[a:b], minlength=len(per_rank))
        parts, rest = [], []
        for i, m in enumerate(self.manifests):
            take = int(mine[i])
            if m.counts is not None:  # this epoch's window of the collection's passes (split.pass_segments)
                start = (epoch * plan.world + plan.rank) * per_rank[i] + int(before[i])
                seed = mix(settings.seed, i)
                segments = pass_segments(start, start + take, m.counts, seed, settings.shardshuffle) if take else []
                parts.append(PartPlan(tuple(segments), take, False))
                rest.append(tuple(rest_of_pass(start, start + take, m.counts, seed, settings.shardshuffle)))
            else:
                units, others = self._round_robin(i, settings, plan, epoch)
                parts.append(PartPlan(units, take, True))
                rest.append(others)
        return MixPlan(actual, epoch, b - a, labels[a:b], tuple(parts),
                       tuple(PartPlan(segments, None, False) for segments in rest) if b > a else ())

    def _round_robin(self, i: int, settings: ReaderSettings, plan: Consumer,
                     epoch: int) -> tuple[tuple[Segment, ...], tuple[Segment, ...]]:
        """(the consumer's units of collection i, the other consumers' units): split.round_robin."""
        return round_robin(len(self.collections[i].urls), plan, mix(settings.seed, i), epoch, settings.shardshuffle)

    def source(self, settings: ReaderSettings, cache: Callable[[], ShardCache], locator: Locator | None) -> MixSource:
        sources = tuple(ShardSource(list(c.urls), settings, m, cache, locator=locator,
                                    read=size_checked(_reader(c.fields), list(c.urls), m))
                        for c, m in zip(self.collections, self.manifests))
        return MixSource(self, sources, settings.seed)


def load_shards(spec: Any, settings: ReaderSettings, manifest: Any) -> tuple[DatasetMix | None, list[str],
                                                                            ShardManifest, str]:
    """(the mix of a dataset spec or None, shard URLs, their manifest, the fingerprint of states)
    for ShardDataset's `spec`: a dataset spec (file or dict), or a plain shard spec."""
    options = settings.storage_options
    if not is_spec(spec):
        urls = expand(spec, options)
        return None, urls, ShardManifest.load(manifest, urls, options), fingerprint(urls)
    loaded = DatasetMix.load(spec, options, manifest)
    loaded.check(settings)
    return loaded, loaded.urls, loaded.manifest(), fingerprint(loaded.urls + [loaded.fingerprint_text()])


def _reader(fields: tuple[str, ...] | None) -> Callable[..., Iterator[dict]]:
    """read_samples, with a collection's `fields` for its record-stream shards."""
    if fields is None:
        return read_samples

    def read(stream: Any, url: str, **kwargs: Any) -> Iterator[dict]:
        if record_format(url):
            return read_records(stream, url, fields=fields, **kwargs)
        return read_samples(stream, url, **kwargs)

    return read


@dataclass(frozen=True)
class MixSource:
    """The raw samples of one consumer's mixed epoch (the `source` of stream.EpochStream)."""

    mix: DatasetMix
    sources: tuple[ShardSource, ...]
    seed: int

    def samples(self, plan: MixPlan, errors: ErrorCount) -> Iterator[dict]:
        streams = [_part(src, part, errors) for src, part in zip(self.sources, plan.parts)]
        try:
            if plan.labels is None:
                yield from self._drawn(plan, streams)
                return
            views = [c.view for c in self.mix.collections]
            for label in _labels(plan.labels):
                sample = next(streams[label], None)
                if sample is None:
                    c = self.mix.collections[label]
                    warn_once(f"collection {c.name!r} ({c.where}) ran out of samples before its quota (a damaged "
                              "or short shard): the rest of the epoch makes up the count")
                    continue
                yield views[label](sample)
        finally:
            for stream in streams:
                stream.close()

    def _drawn(self, plan: MixPlan, streams: list[Iterator[dict]]) -> Iterator[dict]:
        """No quotas: the next collection drawn by weight among those not exhausted."""
        c = plan.consumer
        rng = rng_for(self.seed, plan.epoch, c.rank, c.worker, TAG_MIX)
        collections = self.mix.collections
        weights = [col.weight if col.weight is not None else 1.0 for col in collections]
        active = list(range(len(streams)))
        cumulative = list(itertools.accumulate(weights))  # O(log C) a draw, rebuilt only when one runs out
        while active:
            # the same draws as rng.choices(active, weights of active): choices accumulates them itself
            i = rng.choices(active, cum_weights=cumulative)[0] if len(active) > 1 else active[0]
            sample = next(streams[i], None)
            if sample is None:
                active.remove(i)
                cumulative = list(itertools.accumulate(weights[j] for j in active))
            else:
                yield collections[i].view(sample)


def _labels(labels: Any, chunk: int = 1 << 16) -> Iterator[int]:
    """The labels as Python ints, converted a chunk at a time (never a list of the whole epoch)."""
    for start in range(0, len(labels), chunk):
        yield from labels[start:start + chunk].tolist()


def _part(source: ShardSource, part: PartPlan, errors: ErrorCount) -> Iterator[dict]:
    """The samples of one collection for one consumer: its segments (cycled when asked), `take` of them."""
    taken = 0
    while part.take is None or taken < part.take:
        before = taken
        for segment in part.segments:
            for sample in source.read_segment(segment, errors):
                taken += 1
                yield sample
                if part.take is not None and taken >= part.take:
                    return
        if not part.cycle or taken == before:
            return


__all__ = ["DatasetMix", "MixPlan", "MixSource", "apportion"]
