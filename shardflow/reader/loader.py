"""Loader: a DataLoader over a ShardDataset that knows where it is (state_dict / load_state_dict)."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from shardflow.reader.dataset import ShardDataset
from shardflow.reader.shm import RingConfig, RingReturns
from shardflow.reader.state import EndOfWorker, EpochProgress, Position
from shardflow.reader.warn_once import warn_once


class Loader:
    """A DataLoader over a ShardDataset that knows where it is.

    - iterating it runs one epoch (`set_epoch` is called for you: 0, 1, 2, ... or what you set);
    - `state_dict()` records, per worker, how far the batches *returned to you* got, and
      `load_state_dict()` makes the next iteration yield exactly the rest of that epoch;
    - JPEGs are decoded on the GPU here, in batches, when the dataset asks for it;
    - `stats` counts the samples delivered and skipped (error policy) this epoch.
    Keyword arguments go to torch's DataLoader (pin_memory defaults to "a CUDA device is present";
    in_order=False lets a fast worker's batch overtake a slow one's: each worker's batches stay
    deterministic and resumable, only their interleaving varies). persistent_workers is refused:
    workers start per epoch, carrying the epoch and the resume point.

    The resume guarantee, precisely. Each worker's sequence of batches is a pure function of the
    shard list, the sample counts, seed, epoch, rank, world size, worker id, num_workers and the
    order settings (shuffle, batch_size, equalize, ...). Every batch carries, for its worker, the
    number of raw samples that worker had drawn from its shuffle buffer (`raw`, counting samples it
    then skipped as bad) and the number it had delivered. `state_dict()` holds those numbers for the
    last batch of each worker that the Loader has *returned to you*. A Loader built the same way and
    given that state replays each worker's raw stream, skips its first `raw` samples without
    decoding them (I/O only) and goes on from there. So over the rest of the epoch it yields exactly
    the batches of that epoch that had not been returned before: none twice (batches prefetched
    but not returned are produced again, not lost), none missing, each worker's batches with the
    same contents in the same order; only the interleaving of workers may differ. The shard list,
    seed, order settings, rank, world size and num_workers must be the same (checked: a mismatch is
    a ValueError). A state taken after an epoch ended resumes at the start of the next epoch. With a
    plain DataLoader, `ShardDataset.load_state_dict(state)` resumes the same way.

    Zero-copy batches. Image batches cross from the workers in a few shared-memory buffers per
    worker that are reused (see shm.Ring): a buffer goes back to its worker only when no tensor in this
    process refers to it any more (the batch and every view of it are gone), so batches you keep stay
    intact. A batch handed on to *another* process (a multiprocessing queue) should be `.clone()`d
    first. With pin_memory=True the pinned copy is what you get, and buffers return at once.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        num_workers: int = 0,
        *,
        pin_memory: bool | None = None,
        prefetch_factor: int | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError("Loader needs a ShardDataset")
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("Loader starts its workers per epoch (the epoch and resume point travel with them)")
        self.dataset = dataset
        self.num_workers = int(num_workers)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._pinning = bool(self.pin_memory) and torch.cuda.is_available()  # what DataLoader really does
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self.kwargs = dataloader_kwargs
        self.epoch = dataset.epoch
        self._positions: dict[int, Position] = {}
        self._resume: EpochProgress | None = None
        self._finished = False

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Run `epoch` next (a resume point loaded for another epoch is dropped)."""
        if int(epoch) != self.epoch:
            self._resume = None
            self._positions = {}
        self._finished = False
        self.epoch = int(epoch)

    @property
    def stats(self) -> dict[str, int]:
        return {
            "skipped": sum(p.errors for p in self._positions.values()),
            "delivered": sum(p.delivered for p in self._positions.values()),
        }

    def state_dict(self) -> dict[str, Any]:
        progress = EpochProgress(self.epoch, self.num_workers, self._positions, self._finished)
        return self.dataset.state_scope().state(progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.state_scope().check(state)
        if max(1, int(state["num_workers"])) != max(1, self.num_workers):
            raise ValueError(
                f"the state was saved with num_workers={state['num_workers']}; this Loader has "
                f"{self.num_workers} (each worker replays its own part of the epoch)"
            )
        self.epoch, self._resume = EpochProgress.resume_point(state, self.num_workers)
        self._positions = dict(self._resume.workers) if self._resume is not None else {}
        self._finished = False

    def __iter__(self) -> Iterator[Any]:
        if self._finished:  # the previous epoch ran to its end: go on with the next one
            self.epoch += 1
            self._positions, self._finished = {}, False
        resume, self._resume = self._resume, None
        kwargs = dict(self.kwargs)
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        ring = self._ring_config(kwargs.get("multiprocessing_context"))
        ds = self.dataset.for_loader(self.epoch, resume, ring)
        self._positions = positions = dict(resume.workers) if resume is not None else {}
        # Say once, here in the main process, what worker 0 would say in every epoch.
        workers = max(1, self.num_workers)
        if not ds.resampled and ds.assignment(0, workers).split_inside:
            warn_once(ds.split_message(workers))
        kwargs.setdefault("collate_fn", _as_is)  # keep tuples and numpy arrays as the dataset made them
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory, **kwargs)
        returns = RingReturns(ring) if ring is not None else None
        it = iter(loader)
        try:
            for item, tag in it:
                positions[tag.worker] = tag.position
                if isinstance(item, EndOfWorker):
                    continue
                if returns is not None:
                    item = returns.accept(item, tag.worker, tag.slots, self._pinning)
                if ds.gpu_decode:
                    item = ds.finish(item)
                yield item
        finally:
            del it
        self._finished = True

    def _ring_config(self, context: Any) -> RingConfig | None:
        """Shared-memory rings for the workers' image batches (only for the default collate)."""
        ds = self.dataset
        if self.num_workers > 0 and ds.batch_size is not None and ds.collate_fn is None:
            return RingConfig.create(self.num_workers, self.prefetch_factor, self._pinning, context)
        return None

    def __repr__(self) -> str:
        return f"Loader({len(self.dataset.urls)} shards, num_workers={self.num_workers}, epoch={self.epoch})"


def _as_is(item: Any) -> Any:
    return item
