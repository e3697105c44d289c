"""ShardDataset: the training reader (a PyTorch IterableDataset).

    ds = sf.ShardDataset("s3://b/train-{000000..000554}.tar", decode="torchrgb8", shuffle=1000,
                         batch_size=64, seed=0, equalize="drop")
    loader = sf.Loader(ds, num_workers=8)          # or DataLoader(ds, batch_size=None, num_workers=8)
    for epoch in range(start, epochs):
        for batch in loader: ...                   # batch["jpg"]: uint8 (64, 3, H, W); batch["__key__"]: list
        torch.save({"loader": loader.state_dict(), ...})   # any time, mid-epoch too

The dataset composes the parts of this package: its options (settings.py), the split over ranks and
workers (layout.py, split.py), one consumer's epoch as a chain of stages (stream.py) and the
resume state (state.py). It keeps only what changes between epochs: the epoch, and where in-process
iteration got to.

Guarantees (the long version: Loader's docstring):
- one epoch = every sample exactly once over all ranks and workers (unless equalize/epoch_size ask for
  fixed counts; resampled=True draws shards with replacement instead);
- the order is a function of (seed, epoch, rank, worker) only, through integer hashing;
- what map= (and a collate fn) draw at random is a function of (seed, epoch, sample key) only: the
  global generators and sf.sample_rng(sample) are seeded per sample (reader/seeding.py);
- `Loader.state_dict()` taken after the n-th batch, loaded into a new Loader (same shards, seed,
  world size and num_workers), yields exactly the batches the first one had not yet returned.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from typing import Any, Iterator, Sequence

from torch.utils.data import IterableDataset, get_worker_info

from shardflow.codecs.planes import limit_threads
from shardflow.reader.cache import ShardCache
from shardflow.reader.collate import collate
from shardflow.reader.gpu import GpuDecoder
from shardflow.reader.layout import Layout
from shardflow.reader.manifest_check import size_checked
from shardflow.reader.mix import load_shards
from shardflow.reader.place import ImagePlacer
from shardflow.reader.prepare import SampleDecoders, SamplePreparer
from shardflow.reader.seeding import epoch_seed, keeping_global_rngs
from shardflow.reader.settings import OPTION_NAMES, ReaderOptions, ReaderSettings, option_help
from shardflow.reader.shard_source import ShardSource
from shardflow.reader.shm import Ring, RingConfig
from shardflow.reader.split import Assignment
from shardflow.reader.state import (
    EndOfWorker,
    EpochProgress,
    ErrorCount,
    Position,
    StateScope,
    order_config,
)
from shardflow.reader.stream import Cursor, EpochStream
from shardflow.reader.warn_once import warn_once
from shardflow.shards.samples import read_samples
from shardflow.storage.locate import current_locator


class _Setting:
    """A ShardDataset attribute backed by a field of its ReaderSettings (one per field, set below the
    class). Assigning to it (as code written for the old plain attributes does, e.g.
    `ds.gpu_decode = True`) replaces the settings (dataclasses.replace)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj.settings, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.settings = dataclasses.replace(obj.settings, **{self.name: value})


class ShardDataset(IterableDataset):
    """Samples (or batches) of WebDataset tar shards from any fsspec URL, split across ranks and
    DataLoader workers so that an epoch delivers every sample once.

    ShardDataset(spec, *, manifest=None, rewrite=None, mirror=None, **options)
    - spec: shard spec (brace pattern, glob, list, `a::b`; see shardflow.storage.specs.expand), or a
      dataset spec (`train.yaml`/`.json` or a dict) whose collections are mixed (see reader/mix.py).
    - manifest: sample counts per shard; None: use `<dir of first shard>/_shardflow/summary.json` if
      it lists every shard; a run-dir/summary.json URL; a list of ShardInfo dicts; False: never.
    - rewrite ("PREFIX=REPLACEMENT" rules), mirror (a directory of local copies): where shards are
      really read from, before the process's own rules (see docs/specs.md).
    - options: the fields of ReaderOptions (reader/settings.py), listed below with their defaults; an
      unknown keyword is a TypeError. `ds.<option>` reads the resolved value (ds.settings); assigning
      one replaces ds.settings.

    spec, manifest, rewrite and mirror are not ReaderOptions: they say which shards there are, how many
    samples each holds and where it is really read from, not how to read them. They are resolved once,
    here (the manifest loaded, the process's location rules taken with rewrite/mirror added), and what
    they resolve to (urls, the manifest, a Locator) travels with the dataset, not in its settings.

    Notes on the options
    - decode defaults to "torchrgb8" here (a model wants tensors) and to None in ShardJob (a job mostly
      re-encodes or copies bytes; decoding them would be wasted): see docs/reader.md.
    - decode `"torchrgb8-cuda"` (or `gpu_decode=True`) decodes JPEGs on the GPU in batches in the main
      process (Loader, or in-process iteration); without a GPU it warns and decodes on CPU.
    - the shuffle buffer holds raw (still encoded) samples; set_epoch(e) picks the epoch of the order.
    - channels_last: image batches of torch uint8 specs come as (B, C, H, W) tensors in channels-last
      memory (`batch.is_contiguous(memory_format=torch.channels_last)`): the decoded HWC pixels are
      copied into the batch as they are, skipping the HWC -> CHW transposition (a quarter of the
      decode cost at 256x256). Same values; use `.reshape`, not `.view`, on them.
    - on_error applies to bad samples and damaged shards, and to a shard whose size on open differs
      from its manifest's (a stale count: reader/manifest_check.py); a shard that cannot be opened
      (missing) is always an error naming it.
    - a fixed count (equalize / epoch_size) holds when samples go missing (map= drops, damage): a
      worker short of its quota reads its part again, then the rest of the epoch (stream.py).
    - split_by_node / split_by_worker, rank / world_size override the splitting (default: split by
      torch.distributed rank when initialised, else the RANK/WORLD_SIZE environment, and by worker).
    """

    _worker_ring: Ring | None = None  # in a Loader's worker: its ring, kept while the worker lives

    # the options as attributes (`ds.batch_size`): _Setting descriptors, one per ReaderSettings field

    def __init__(self, spec: str | Sequence[str], *, manifest: Any = None, rewrite: Sequence[str] | str | None = None,
                 mirror: str | None = None, **options: Any) -> None:
        super().__init__()
        settings = ReaderSettings.from_options(_reader_options(options))
        # rewrite= / mirror= add to the process's rules and mirror (storage/locate.py), for this dataset
        self._locator = current_locator(rewrite, mirror) if rewrite or mirror else None
        self._decoders = SampleDecoders.create(settings)  # now: a Decoder snapshots the registered codecs
        self.spec = spec
        # a dataset spec (train.yaml, a dict) mixes collections (reader/mix.py); else a shard spec
        self._mix, self.urls, self._manifest, self.fingerprint = load_shards(spec, settings, manifest)
        settings.check_counts(self._manifest.counts is not None)
        self.settings = settings
        self.epoch = 0
        self._iterations = 0  # iterations of this object since set_epoch (see __iter__)
        self._cache: ShardCache | None = None
        # in-process iteration: where the next epoch starts, how far the current one got
        self._resume: EpochProgress | None = None
        self._progress: EpochProgress | None = None
        # set on the copy a Loader iterates (see for_loader)
        self._tagged = False  # yield (item, ConsumerTag) pairs
        self._ring: RingConfig | None = None

    # -- shards and layout -----------------------------------------------------------------------

    @property
    def counts(self) -> list[int] | None:
        """Samples per shard, when a manifest says."""
        return self._manifest.counts

    @property
    def manifest(self) -> str | None:
        """Where the sample counts came from (a summary.json URL, "<list>"), or None."""
        return self._manifest.source

    @property
    def nsamples(self) -> int | None:
        """Samples in all shards, when the manifest says."""
        return None if self.counts is None else sum(self.counts)

    @property
    def _layout(self) -> Layout:
        return Layout(self.settings, self.urls, self.counts)

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size): explicit, else torch.distributed when initialised, else the env."""
        return self._layout.rank_world()

    def assignment(self, worker: int = 0, workers: int = 1, epoch: int | None = None) -> Assignment:
        """What the consumer (this rank, `worker` of `workers`) reads in `epoch` (not resampled)."""
        return self._layout.assignment(worker, workers, self.epoch if epoch is None else epoch)

    def split_message(self, workers: int) -> str:
        """The warning for fewer shards than the ranks x `workers` readers."""
        return self._layout.split_message(workers)

    def __len__(self) -> int:
        """Items (batches when batch_size is set, else samples) this rank gets per epoch."""
        if self._mix is not None:
            return self._mix.length(self.settings, self._layout.plan_rank_world()[1], self.epoch)
        return self._layout.length()

    # -- epochs and state ------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs: its shard order and shuffle depend on
        (seed, epoch, rank, worker). Without set_epoch, each further iteration of the same object
        runs the next epoch (in-process, and in persistent DataLoader workers)."""
        epoch = int(epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None
        self.epoch = epoch
        self._iterations = 0

    def state_scope(self) -> StateScope:
        """What a state of this dataset belongs to (shards, seed, order settings, rank, world size)."""
        rank, world = self._layout.plan_rank_world()
        return StateScope(self.seed, self.fingerprint, order_config(self.settings, self.counts), rank, world)

    def state_dict(self) -> dict[str, Any]:
        """Progress of in-process iteration (use Loader.state_dict() with DataLoader workers)."""
        progress = self._progress
        if progress is None:
            progress = EpochProgress(self.epoch + self._iterations, 0)
        return self.state_scope().state(progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration of the recorded epoch skips what was delivered before
        (a finished epoch moves on to the next one)."""
        self.state_scope().check(state)
        self._iterations = 0
        self.epoch, self._resume = EpochProgress.resume_point(state, int(state["num_workers"]))
        self._progress = None

    def for_loader(self, epoch: int, resume: EpochProgress | None, ring: RingConfig | None) -> ShardDataset:
        """The copy a Loader iterates: it runs `epoch` from `resume`, yields (item, ConsumerTag)
        pairs, and its workers write image batches into the shared-memory rings of `ring`."""
        ds = copy.copy(self)
        ds.set_epoch(epoch)  # (also resets the copy's iteration count)
        ds._resume = resume
        ds._progress = None
        ds._tagged = True
        ds._ring = ring
        ds._worker_ring = None
        return ds

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        in_worker = info is not None
        if in_worker:
            limit_threads(1)  # torch already runs one thread per DataLoader worker; OpenCV alike
        if self.gpu_decode and in_worker and not self._tagged:
            warn_once("GPU JPEG decode runs in the main process: iterate with shardflow.Loader; "
                      "decoding on CPU in the DataLoader workers instead")
        gpu_defer = self.gpu_decode and (self._tagged or not in_worker)
        epoch, start = self._begin_epoch(worker, workers, in_worker)
        if worker == 0:
            self._warn_unequal_ranks(epoch)
        items = iter(self._epoch_stream(worker, workers, epoch, start, gpu_defer))
        if not in_worker and (self.map is not None or self.collate_fn is not None):
            items = keeping_global_rngs(items)  # map= reseeds them per sample; the caller's draws stay its own
        finish = self.finish if gpu_defer and not self._tagged else None
        try:
            for item, tag in items:
                if self._tagged:
                    yield item, tag
                    continue
                if not in_worker:
                    self._progress.workers[worker] = tag.position  # type: ignore[union-attr]
                if isinstance(item, EndOfWorker):
                    continue
                yield finish(item) if finish is not None else item
        finally:
            items.close()  # type: ignore[attr-defined]
        if not in_worker and self._progress is not None:
            self._progress.finished = True

    def _warn_unequal_ranks(self, epoch: int) -> None:
        """Say (once per process) when several ranks will yield different numbers of items."""
        quotas = None if self._mix is None else self._mix.quotas(self.settings, epoch) is not None
        message = self._layout.unequal_ranks_message(quotas)
        if message is not None:
            warn_once(message, stacklevel=4)

    def _begin_epoch(self, worker: int, workers: int, in_worker: bool) -> tuple[int, Position]:
        """(the epoch this iteration runs, where `worker` starts in it); in-process, also starts
        recording progress."""
        epoch = self.epoch + self._iterations
        self._iterations += 1
        resume = self._resume if self._resume is not None and self._resume.epoch == epoch else None
        if resume is not None and max(1, resume.num_workers) != max(1, workers):
            raise ValueError(
                f"the state was saved with num_workers={resume.num_workers}; resume with the same number "
                f"(now {workers}): each worker replays its own part of the epoch"
            )
        start = resume.workers.get(worker, Position()) if resume is not None else Position()
        if not in_worker:
            self._resume = None  # consumed (a worker's copy is thrown away anyway)
            self._progress = EpochProgress(epoch, workers, dict(resume.workers) if resume is not None else {})
        return epoch, start

    def _epoch_stream(self, worker: int, workers: int, epoch: int, start: Position, gpu_defer: bool) -> EpochStream:
        """One consumer's epoch, from `start` (see stream.py)."""
        s = self.settings
        layout = self._layout
        plan = layout.epoch_plan(worker, workers, epoch) if self._mix is None else \
            self._mix.epoch_plan(s, *layout.consumers(worker, workers), epoch)
        if plan.assignment is not None and plan.assignment.split_inside and (worker == 0 or not s.split_by_worker):
            warn_once(layout.split_message(max(1, workers)))
        shared = get_worker_info() is not None  # in a worker: batches go to shared memory
        ring = None
        if shared and self._ring is not None and s.batch_size is not None and s.collate_fn is None:
            if self._worker_ring is None:  # one per worker process: persistent workers keep theirs
                self._worker_ring = self._ring.ring(worker, s.batch_size)
            ring = self._worker_ring
        collate_batch = s.collate_fn
        if collate_batch is None:
            collate_batch = functools.partial(collate, shared=shared, channels_last=s.channels_last, ring=ring)
        errors = ErrorCount(s.on_error, start.errors)
        placer = None
        if s.collate_fn is None and s.batch_size is not None and self._decoders.placeable and not gpu_defer:
            placer = ImagePlacer(s.batch_size, s.channels_last, shared, ring)
        return EpochStream(
            plan=plan, source=ShardSource(self.urls, s, self._manifest, self._shard_cache, locator=self._locator,
                                          read=size_checked(read_samples, self.urls, self._manifest))
            if self._mix is None else self._mix.source(s, self._shard_cache, self._locator),
            prepare=SamplePreparer(self._decoders, s.map, s.to_tuple, errors, gpu_defer, placer,
                                   seed=epoch_seed(s.seed, epoch)),
            collate=collate_batch, ring=ring, cursor=Cursor(worker, start, errors),
            shuffle=s.shuffle, seed=s.seed, batch_size=s.batch_size, partial=s.partial, gpu_defer=gpu_defer,
            placer=placer, seeded_collate=s.collate_fn is not None,
        )

    def _shard_cache(self) -> ShardCache:
        """This process's cache of remote shards, made on first use (making it scans the folder)."""
        if self._cache is None:
            self._cache = ShardCache(self.cache_dir, self.cache_size)  # type: ignore[arg-type]
        return self._cache

    def finish(self, item: Any) -> Any:
        """Decode the JPEGs a worker left encoded (GPU decode); other values pass through."""
        return GpuDecoder(self.decode, self.device, self.channels_last, self.allow_pickle)(item)

    # -- pickling (DataLoader workers with spawn/forkserver; copy.copy goes through here too) ------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_progress"] = None
        if self.settings.rank_world is None:
            try:  # as the main process sees it
                state["settings"] = dataclasses.replace(self.settings, rank_world=self._layout.rank_world())
            except ValueError:
                pass
        return state


def _reader_options(given: dict[str, Any]) -> ReaderOptions:
    """ShardDataset's keywords as ReaderOptions; an unknown one is a TypeError naming it (as Python's own)."""
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        raise TypeError(f"ShardDataset() got unexpected keyword argument{s} {', '.join(map(repr, unknown))}; "
                        f"valid: spec, {', '.join(_EXPLICIT)}, {', '.join(OPTION_NAMES)}")
    return ReaderOptions(**given)


_EXPLICIT = ("manifest", "rewrite", "mirror")  # ShardDataset's keywords that are not ReaderOptions


def _signature(written: inspect.Signature) -> inspect.Signature:
    """`written` (__init__'s own: self, spec, the explicit keywords, **options) with **options replaced
    by every ReaderOptions field and its default: what help() and editors show, derived from the
    fields rather than written out a second time."""
    params = [p for p in written.parameters.values() if p.kind is not p.VAR_KEYWORD and p.name not in _EXPLICIT]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(ReaderOptions)]
    params += [written.parameters[name] for name in _EXPLICIT]
    return written.replace(parameters=params)


def _options_doc() -> str:
    lines = [f"    - {f.name}={f.default!r}: {option_help(f.name)}" for f in dataclasses.fields(ReaderOptions)]
    return "\n    Options (ReaderOptions)\n" + "\n".join(lines) + "\n"


for _field in dataclasses.fields(ReaderSettings):
    if _field.name != "rank_world":  # ShardDataset.rank_world() is a method: the resolved rank and world size
        setattr(ShardDataset, _field.name, _Setting(_field.name))
_init = _signature(inspect.signature(ShardDataset.__init__))
ShardDataset.__init__.__signature__ = _init  # type: ignore[attr-defined]
ShardDataset.__signature__ = _init.replace(parameters=list(_init.parameters.values())[1:])  # type: ignore[attr-defined]
if ShardDataset.__doc__:  # (None under python -OO)
    ShardDataset.__doc__ += _options_doc()
