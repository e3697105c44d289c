"""Where a consumer is in its epoch, and the resume state built from it.

Each consumer (one DataLoader worker of one rank) tags every item it yields with its position: how
many raw samples it had drawn from its shuffle buffer, how many it had delivered, how many problems it
had skipped. A state dict holds, per worker, the position of the last item the user got; replaying
that worker's raw stream and skipping `raw` samples (without decoding them) resumes it exactly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from shardflow.errors import ShardflowError, apply_policy

if TYPE_CHECKING:
    from shardflow.reader.settings import ReaderSettings

STATE_VERSION = 1


class Position(NamedTuple):
    """A consumer's progress in its epoch: what the state dict saves per worker."""

    raw: int = 0  # samples drawn from the shuffle buffer (bad ones and skipped ones too)
    delivered: int = 0  # samples in the items yielded
    errors: int = 0  # problems skipped (the error policy)


class ConsumerTag(NamedTuple):
    """Sent with every item of a consumer (under a Loader): its worker, position and ring slots."""

    worker: int
    raw: int
    delivered: int
    errors: int
    slots: tuple[tuple[int, Any], ...] = ()  # ring slots the item's tensors live in (see shm.py)

    @property
    def position(self) -> Position:
        return _new_tuple(Position, self[1:4])

    @classmethod
    def of(cls, worker: int, raw: int, delivered: int, errors: int, slots: tuple = ()) -> ConsumerTag:
        """A tag, made fast (one per sample when unbatched: NamedTuple's __new__ is a Python call)."""
        return _new_tuple(cls, (worker, raw, delivered, errors, slots))


_new_tuple = tuple.__new__  # what NamedTuple._make does, without its checks


class EndOfWorker:
    """Sent by a worker after its last item: its tag carries the final counts to the Loader."""


class ErrorCount:
    """Counts the problems a consumer skipped; raises or warns as `on_error` says."""

    def __init__(self, on_error: str, count: int = 0) -> None:
        self.on_error = on_error
        self.count = count

    def reported(self, error: ShardflowError) -> None:
        """A problem read_samples already handled (it warns itself when on_error='warn')."""
        self.count += 1

    def handle(self, error: ShardflowError) -> None:
        """A problem found here: raise it, or count it (and warn, with on_error='warn')."""
        apply_policy(error, self.on_error, self.reported, stacklevel=4)


@dataclass
class EpochProgress:
    """One epoch's positions per worker: how far iteration got, or where to resume it."""

    epoch: int
    num_workers: int
    workers: dict[int, Position] = field(default_factory=dict)
    finished: bool = False

    @classmethod
    def resume_point(cls, state: dict[str, Any], num_workers: int) -> tuple[int, EpochProgress | None]:
        """(the epoch to run next, where in it to start: None for its beginning) from a checked state."""
        if state["finished"]:
            return int(state["epoch"]) + 1, None
        epoch = int(state["epoch"])
        return epoch, cls(epoch, num_workers, {int(k): Position(*v) for k, v in state["workers"].items()})


def fingerprint(values: Sequence[str]) -> str:
    """A short hash of a list of strings (shard URLs, counts): what a state must match."""
    return hashlib.sha256("\n".join(values).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def order_config(settings: ReaderSettings, counts: Sequence[int] | None) -> dict[str, Any]:
    """The parameters (besides shards, seed and layout) that a worker's sequence depends on: the options
    ReaderOptions marks `order` (ReaderSettings.order) and the sample counts."""
    return {**settings.order(), "counts": fingerprint([str(n) for n in counts]) if counts is not None else None}


@dataclass(frozen=True)
class StateScope:
    """What a state belongs to: a state saved under one scope resumes only under the same one."""

    seed: int
    shards: str  # fingerprint of the shard URLs
    config: dict[str, Any]  # order_config
    rank: int
    world: int

    def state(self, progress: EpochProgress) -> dict[str, Any]:
        """The state dict (JSON-able) of `progress`."""
        return {
            "version": STATE_VERSION,
            "epoch": int(progress.epoch),
            "finished": bool(progress.finished),
            "seed": self.seed,
            "shards": self.shards,
            "rank": self.rank,
            "world_size": self.world,
            "num_workers": int(progress.num_workers),
            "config": self.config,
            "workers": {str(k): [int(x) for x in v] for k, v in sorted(progress.workers.items())},
        }

    def check(self, state: dict[str, Any]) -> None:
        """Raise ValueError (saying what differs) unless `state` was saved under this scope."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a ShardDataset state (version {STATE_VERSION}): {state!r:.200}")
        if state["shards"] != self.shards:
            raise ValueError("the state was saved for a different list of shards")
        if state["seed"] != self.seed:
            raise ValueError(f"the state was saved with seed={state['seed']}, this dataset has seed={self.seed}")
        if state.get("config") != self.config:
            theirs, ours = state.get("config") or {}, self.config
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise ValueError(f"the state was saved with other reader settings ({', '.join(diff)} differ)")
        if state["world_size"] != self.world or state["rank"] != self.rank:
            raise ValueError(
                f"the state was saved by rank {state['rank']} of {state['world_size']}; this is rank {self.rank} "
                f"of {self.world} (resume each rank from its own state, with the same world size)"
            )
