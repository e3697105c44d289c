"""Loader: a DataLoader over a ShardDataset that knows where it is (state_dict / load_state_dict)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from shardflow.codecs.images import preload_decoders
from shardflow.reader.dataset import ShardDataset
from shardflow.reader.settings import ReaderSettings
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
    deterministic and resumable, only their interleaving varies).

    Persistent workers (the default with num_workers > 0; persistent_workers=False starts them
    per epoch). After an epoch ran to its end the workers stay and run the next epoch, each
    worker's dataset copy going on to the next epoch by itself, and their shared-memory batch
    buffers stay mapped: no fork, start-up and fresh pages per epoch. They start afresh whenever
    that would not give the epoch asked for: an epoch left early (the workers are stopped then), a
    resume point loaded, set_epoch to another than the next epoch, or changed dataset options.

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
        persistent = dataloader_kwargs.pop("persistent_workers", None)
        self.persistent_workers = num_workers > 0 and (persistent is None or bool(persistent))
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
        self._workers: _Workers | None = None  # persistent workers, kept from one epoch to the next

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
        workers = self._kept_workers(resume)
        if workers is None:
            workers = self._start_workers(resume)
        ds, returns = workers.dataset, workers.returns
        self._positions = positions = dict(resume.workers) if resume is not None else {}
        # Say once, here in the main process, what worker 0 would say in every epoch.
        n = max(1, self.num_workers)
        if not ds.resampled and ds.assignment(0, n, self.epoch).split_inside:
            warn_once(ds.split_message(n))
        it = iter(workers.loader)
        complete = False
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
            complete = True
        finally:
            del it
            if complete and self.persistent_workers:
                workers.next_epoch = self.epoch + 1  # where each worker's copy goes on by itself
            else:
                self._stop_workers()
        self._finished = True

    def _kept_workers(self, resume: EpochProgress | None) -> _Workers | None:
        """The persistent workers, when they run the epoch asked for next (else they stop)."""
        kept = self._workers
        if kept is not None and resume is None and kept.next_epoch == self.epoch \
                and kept.settings is self.dataset.settings and kept.urls is self.dataset.urls:
            return kept
        self._stop_workers()
        return None

    def _start_workers(self, resume: EpochProgress | None) -> _Workers:
        """A DataLoader (and its workers, on first use) for the epoch `self.epoch` from `resume`."""
        kwargs = dict(self.kwargs)
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        ring = self._ring_config(kwargs.get("multiprocessing_context"))
        ds = self.dataset.for_loader(self.epoch, resume, ring)
        kwargs.setdefault("collate_fn", _as_is)  # keep tuples and numpy arrays as the dataset made them
        if self.num_workers > 0 and ds.decode is not None:
            preload_decoders()  # forked workers inherit the imports
        if self.persistent_workers:
            kwargs["persistent_workers"] = True
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory, **kwargs)
        workers = _Workers(loader, ds, RingReturns(ring) if ring is not None else None,
                           self.dataset.settings, self.dataset.urls, self.epoch)
        if self.persistent_workers:
            self._workers = workers
        return workers

    def _stop_workers(self) -> None:
        """Stop the persistent workers now (not whenever the garbage collector gets to them)."""
        kept, self._workers = self._workers, None
        it = getattr(kept.loader, "_iterator", None) if kept is not None else None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    def _ring_config(self, context: Any) -> RingConfig | None:
        """Shared-memory rings for the workers' image batches (only for the default collate)."""
        ds = self.dataset
        if self.num_workers > 0 and ds.batch_size is not None and ds.collate_fn is None:
            return RingConfig.create(self.num_workers, self.prefetch_factor, self._pinning, context)
        return None

    def __repr__(self) -> str:
        return f"Loader({len(self.dataset.urls)} shards, num_workers={self.num_workers}, epoch={self.epoch})"


@dataclass
class _Workers:
    """A Loader's DataLoader with what lives as long as its workers."""

    loader: DataLoader
    dataset: ShardDataset  # the copy the workers iterate
    returns: RingReturns | None  # the main process's side of the workers' batch buffers
    settings: ReaderSettings  # the dataset's options when they started (changed: start afresh)
    urls: Any
    next_epoch: int  # the epoch the workers run when iterated again


def _as_is(item: Any) -> Any:
    return item
