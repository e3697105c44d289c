"""Who this process is (rank, world size, worker) and what it reads in an epoch.

The rules themselves are in split.py (pure integers); this module applies them to a dataset's
settings: which rank and world size count (explicit, torch.distributed, or the environment), which
consumer the split is planned for (split_by_node / split_by_worker may turn splitting off), and
what that consumer's epoch holds.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Sequence

from shardflow.reader.manifest import summary_url
from shardflow.reader.settings import ReaderSettings
from shardflow.reader.split import Assignment, Consumer, assign, rank_length


@dataclass(frozen=True)
class EpochPlan:
    """One consumer's epoch: what it reads, and the identity that seeds its random streams."""

    consumer: Consumer  # the actual (rank, worker): seeds the shuffle buffer and resampling
    epoch: int
    assignment: Assignment | None  # None: resampled (shards drawn with replacement)
    quota: int | None  # samples to yield (None: all the assignment holds, or forever when resampled)

    @property
    def resampled(self) -> bool:
        return self.assignment is None

    def refill_plan(self) -> EpochPlan | None:
        """What a refill pass reads after the consumer's own part again: the rest of the epoch
        (Assignment.refill; stream.EpochStream); None when there is none."""
        a = self.assignment
        if a is None or not a.refill:
            return None
        return dataclasses.replace(self, assignment=dataclasses.replace(a, segments=a.refill))


@dataclass(frozen=True)
class Layout:
    """The split of a dataset's shards over ranks and workers."""

    settings: ReaderSettings
    urls: Sequence[str]
    counts: Sequence[int] | None

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size): explicit, else torch.distributed when initialised, else the env."""
        if self.settings.rank_world is not None:
            return self.settings.rank_world
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except (ImportError, RuntimeError):
            pass
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        if not 0 <= rank < world:
            raise ValueError(f"RANK={rank} is not in range for WORLD_SIZE={world}")
        return rank, world

    def plan_rank_world(self) -> tuple[int, int]:
        """(rank, world size) the split is planned for: (0, 1) when not splitting by node."""
        return self.rank_world() if self.settings.split_by_node else (0, 1)

    def consumers(self, worker: int, workers: int) -> tuple[Consumer, Consumer]:
        """(actual consumer, consumer used for splitting)."""
        rank, world = self.rank_world()
        actual = Consumer(rank, world, worker, max(1, workers))
        prank, pworld = self.plan_rank_world()
        pworker, pworkers = (worker, max(1, workers)) if self.settings.split_by_worker else (0, 1)
        return actual, Consumer(prank, pworld, pworker, pworkers)

    def assignment(self, worker: int, workers: int, epoch: int) -> Assignment:
        """What the consumer (this rank, `worker` of `workers`) reads in `epoch` (not resampled)."""
        _, plan = self.consumers(worker, workers)
        s = self.settings
        return assign(
            len(self.urls), plan, counts=self.counts, seed=s.seed, epoch=epoch, shardshuffle=s.shardshuffle,
            equalize=s.equalize, epoch_size=s.epoch_size, batch_size=s.batch_size, partial=s.partial,
        )

    def resampled_quota(self, worker: int, workers: int) -> int | None:
        """For resampled streams: samples this worker yields per epoch (None: forever)."""
        s = self.settings
        if s.epoch_size is None:
            return None
        _, plan = self.consumers(worker, workers)
        return assign(
            len(self.urls), plan, counts=None, seed=s.seed, epoch=0, shardshuffle=False,
            equalize=s.equalize, epoch_size=s.epoch_size, batch_size=s.batch_size, partial=s.partial,
        ).quota

    def epoch_plan(self, worker: int, workers: int, epoch: int) -> EpochPlan:
        """What `worker` of `workers` on this rank reads in `epoch`."""
        actual, _ = self.consumers(worker, workers)
        if self.settings.resampled:
            return EpochPlan(actual, epoch, None, self.resampled_quota(workers=workers, worker=worker))
        assignment = self.assignment(worker, workers, epoch)
        return EpochPlan(actual, epoch, assignment, assignment.quota)

    def length(self) -> int:
        """Items (batches when batch_size is set, else samples) this rank gets per epoch."""
        s = self.settings
        rank, world = self.plan_rank_world()
        n = rank_length(
            None if s.resampled else self.counts, world, rank, equalize=s.equalize,
            epoch_size=s.epoch_size, batch_size=s.batch_size, partial=s.partial,
        )
        if n is None:
            why = "resampled=True without epoch_size= is an endless stream" if s.resampled else (
                f"the shards' sample counts are unknown (no manifest found at {summary_url(self.urls[0])})"
            )
            raise TypeError(
                f"len() of this ShardDataset is unknown: {why}; pass manifest= (a job's run directory or "
                "its summary.json) or epoch_size= (samples per epoch over all ranks)"
            )
        return n

    def unequal_ranks_message(self, mixed_quotas: bool | None = None) -> str | None:
        """The warning for several ranks whose sample counts nothing makes equal (counts unknown, no
        equalize=/epoch_size=, not resampled; a mixed spec without quotas): the ranks then yield
        different numbers of batches, and a collective op after the shortest rank's last batch (DDP's
        gradient all_reduce) waits forever. None when the counts are equal. `mixed_quotas`: for a
        dataset spec, whether its quotas are known (they equalise the ranks)."""
        s = self.settings
        _, world = self.plan_rank_world()
        if world <= 1 or s.resampled:
            return None
        if mixed_quotas is not None:
            if mixed_quotas:
                return None
        elif self.counts is not None or s.epoch_size is not None:
            return None
        return (f"{world} ranks read shards without sample counts (no manifest at {summary_url(self.urls[0])}) "
                "and nothing equalises them: ranks get different numbers of samples, and a collective op "
                "at the end of the epoch (DDP's all_reduce) can hang; run `shardflow index SPEC` once (then "
                "pass equalize='drop'), or give epoch_size= (see docs/reader.md, 'Training on several ranks')")

    def split_message(self, workers: int) -> str:
        """The warning for fewer shards than readers (shards are then split between workers)."""
        _, world = self.plan_rank_world()
        workers = workers if self.settings.split_by_worker else 1
        n = world * workers
        return (
            f"{len(self.urls)} shards for {n} readers ({world} ranks x {workers} workers): splitting inside "
            f"shards, so some shards are read by several workers; use at least {n} shards for the best I/O"
        )
