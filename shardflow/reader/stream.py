"""One consumer's epoch as a chain of small generator stages:

    passes (segments -> read -> shuffle) -> skip -> prepare -> batch

Raw samples are shuffled, so the buffer holds compressed bytes, and skipping (resume) never decodes.
A fixed quota (equalize / epoch_size, a dataset spec's quotas) may need more than one pass over the
consumer's part (a plan's refill_plan() says what a refill reads after it); the
stages share one Cursor, whose counters say when to stop and go into every item's tag.
Every stage closes the one before it when it stops, so a shard's stream is closed (and a cached
copy committed) as soon as nobody will read from it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from shardflow.reader.layout import EpochPlan
from shardflow.reader.place import ImagePlacer
from shardflow.reader.prepare import SamplePreparer
from shardflow.reader.seeding import call_seeded
from shardflow.reader.shard_source import ShardSource
from shardflow.reader.shm import Ring, UsedSlots, outgoing
from shardflow.reader.split import TAG_BUFFER, TAG_REFILL, rng_for
from shardflow.reader.state import ConsumerTag, EndOfWorker, ErrorCount, Position
from shardflow.reader.values import pack_unbatched
from shardflow.reader.warn_once import warn_once


class Cursor:
    """The counters of one consumer's epoch; (raw, delivered, errors) is its resume Position."""

    __slots__ = ("worker", "skip", "raw", "taken", "delivered", "errors")

    def __init__(self, worker: int, start: Position, errors: ErrorCount) -> None:
        self.worker = worker
        self.skip = start.raw  # raw samples delivered before the resume point
        self.raw = 0  # samples drawn from the shuffle buffer (in every pass)
        self.taken = start.delivered  # samples out of prepare: delivered + waiting in the batch
        self.delivered = start.delivered  # samples in the items yielded
        self.errors = errors

    def tag(self, slots: UsedSlots = ()) -> ConsumerTag:
        return ConsumerTag.of(self.worker, self.raw, self.delivered, self.errors.count, slots)


@dataclass
class EpochStream:
    """Iterating it yields (item, ConsumerTag) pairs, then (EndOfWorker(), final tag)."""

    plan: EpochPlan
    source: ShardSource
    prepare: SamplePreparer
    collate: Callable[[list[Any]], Any]
    ring: Ring | None
    cursor: Cursor
    shuffle: int  # shuffle-buffer size (<= 1: keep the order)
    seed: int
    batch_size: int | None
    partial: bool
    gpu_defer: bool  # raw JPEGs stay encoded for the GPU
    placer: ImagePlacer | None = None  # decodes JPEGs into their batch row: told the row here
    seeded_collate: bool = False  # a user collate_fn: seeded from (epoch seed, first key, "batch")

    def __iter__(self) -> Iterator[tuple[Any, ConsumerTag]]:
        try:
            yield from self._batches(self._prepared(self._skipped(self._passes())))
        finally:
            if self.placer is not None:
                self.placer.close()  # a batch buffer nothing claimed goes back to the ring
        # the final tally (problems found after the last batch), not an item for the user
        yield EndOfWorker(), self.cursor.tag()

    def _one_pass(self, pass_no: int) -> Iterator[dict]:
        """segments -> read -> shuffle: the raw samples of one pass over the consumer's part; a refill
        pass (pass_no > 0) then goes on with the rest of the epoch (plan.refill_plan(): the plain
        path's Assignment.refill, or a mixed spec's rest of every collection), shuffled on its own, so
        the consumer's own samples come first and the others only when those run out."""
        c, plan, errors = self.plan.consumer, self.plan, self.cursor.errors
        rng = rng_for(self.seed, plan.epoch, c.rank, c.worker, TAG_BUFFER, pass_no)
        own = shuffle_buffer(self.source.samples(plan, errors), self.shuffle, rng)
        others = plan.refill_plan() if pass_no > 0 else None
        if others is None:
            return own
        rng = rng_for(self.seed, plan.epoch, c.rank, c.worker, TAG_BUFFER, pass_no, TAG_REFILL)
        return _chain(own, shuffle_buffer(self.source.samples(others, errors), self.shuffle, rng))

    def _passes(self) -> Iterator[dict]:
        """Raw samples, pass after pass while a quota asks for more (and a pass can give more).

        What each pass reads is fixed in advance (never chosen by what map= dropped), so a resumed
        consumer replays the same raw stream. A consumer gives up short of its quota only when a whole
        refill pass (every sample of the epoch) gave nothing, and only judging a pass it drew whole
        after its resume point: a pass partly skipped on resume gave something before (it was not the
        last), whatever its fresh part gives."""
        cursor, quota = self.cursor, self.plan.quota
        for pass_no in itertools.count():
            if quota is not None and cursor.taken >= quota:
                break
            if pass_no > 0 and (quota is None or self.plan.resampled):
                break
            raw0, taken0 = cursor.raw, cursor.taken
            stream = self._one_pass(pass_no)
            try:
                for raw in stream:
                    cursor.raw += 1
                    yield raw  # back here once the stages below have dealt with it
                    if quota is not None and cursor.taken >= quota:
                        break
            finally:
                stream.close()
            whole = raw0 >= cursor.skip  # drawn whole after the resume point
            empty = cursor.raw == raw0 or (whole and cursor.taken == taken0)
            refilled = pass_no > 0 or self.plan.refill_plan() is None
            if empty and refilled:
                if quota is not None and cursor.taken < quota:
                    c = self.plan.consumer
                    warn_once(
                        f"rank {c.rank} worker {c.worker}: none of the epoch's samples is left to fill its quota "
                        f"(all dropped by map= or unreadable), so it yields {cursor.taken} instead of {quota} "
                        "(ranks may get unequal counts)"
                    )
                break

    def _skipped(self, raws: Iterator[dict]) -> Iterator[dict]:
        """Raw samples after the resume point (the ones before it are read, never decoded)."""
        return raws if self.cursor.skip == 0 else _after(raws, self.cursor)

    def _prepared(self, raws: Iterator[dict]) -> Iterator[Any]:
        """Decoded, mapped samples; dropped and skipped ones left out."""
        cursor, prepare = self.cursor, self.prepare
        try:
            for raw in raws:
                sample = prepare(raw)
                if sample is not None:
                    cursor.taken += 1
                    yield sample
        finally:
            raws.close()  # type: ignore[attr-defined]

    def _batches(self, samples: Iterator[Any]) -> Iterator[tuple[Any, ConsumerTag]]:
        """Items with their tags: samples one by one, or batches (the last one partial if allowed)."""
        cursor, batch_size, placer = self.cursor, self.batch_size, self.placer
        batch: list[Any] = []
        first = None  # the key of the batch's first sample
        try:
            for sample in samples:
                if batch_size is None:
                    cursor.delivered += 1
                    yield pack_unbatched(sample) if self.gpu_defer else sample, cursor.tag()
                    continue
                if not batch:
                    first = self.prepare.key
                batch.append(sample)
                if len(batch) == batch_size:
                    yield self._batch(batch, first)
                    batch = []
                if placer is not None:
                    placer.row = len(batch)  # the row the next sample takes
        finally:
            samples.close()  # type: ignore[attr-defined]
        quota = self.plan.quota
        if batch and (self.partial or (quota is not None and cursor.taken >= quota)):
            yield self._batch(batch, first)

    def _batch(self, batch: list[Any], first: str | None) -> tuple[Any, ConsumerTag]:
        self.cursor.delivered += len(batch)
        if self.seeded_collate:
            batched = call_seeded(self.collate, batch, self.prepare.seed, first, "batch")
        else:
            batched = self.collate(batch)
        item, used = outgoing(batched, self.ring)
        return item, self.cursor.tag(used)


def _chain(*streams: Iterator[dict]) -> Iterator[dict]:
    """The streams one after the other; closing it closes them all (each shard stream with them)."""
    try:
        for stream in streams:
            yield from stream
    finally:
        for stream in streams:
            stream.close()  # type: ignore[attr-defined]


def _after(raws: Iterator[dict], cursor: Cursor) -> Iterator[dict]:
    """The raws the passes stage draws after the cursor's resume point."""
    skip = cursor.skip
    try:
        for raw in raws:
            if cursor.raw > skip:
                yield raw
    finally:
        raws.close()  # type: ignore[attr-defined]


def shuffle_buffer(samples: Iterator[dict], size: int, rng: Any) -> Iterator[dict]:
    """The samples in the order of a shuffle buffer of `size` (filled to a tenth before the first
    draw, at least 64), drawing with `rng`; size <= 1 keeps the order."""
    try:
        if size <= 1:
            yield from samples
            return
        initial = min(size, max(64, size // 10))
        buf: list[dict] = []
        end = object()
        for sample in samples:
            buf.append(sample)
            if len(buf) < size:
                more = next(samples, end)
                if more is not end:
                    buf.append(more)  # type: ignore[arg-type]
            if len(buf) >= initial:
                i = rng.randrange(len(buf))
                buf[i], buf[-1] = buf[-1], buf[i]
                yield buf.pop()
        while buf:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    finally:
        samples.close()  # type: ignore[attr-defined]
