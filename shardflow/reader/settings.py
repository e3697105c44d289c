"""ReaderOptions and ReaderSettings: the options of a ShardDataset, written once, checked once, then fixed.

ReaderOptions holds the options as the user gives them: each is a field with its default and a one-line
help, written only here. Everything that lists the options derives from its fields: ShardDataset's
keywords, its signature (help(), inspect) and the options part of its docstring, the check that refuses
an unknown keyword, and (metadata `order`) the values a state dict records because they decide the
sample order.

ReaderSettings.from_options(options) checks them (ValueError naming the bad option) and resolves their
shorthands (shuffle=True, seed=None, decode="...-cuda", to_tuple="a;b c", rank/world_size). Everything
the reader does follows from the settings (plus the shard list and its manifest), so they are one frozen
record: a DataLoader worker gets them by pickling, a state dict fingerprints the ones that decide the
order, and a changed option is a new record (dataclasses.replace), never a half-updated object.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from shardflow.codecs import IMAGE_SPECS
from shardflow.codecs.gpu import CUDA_SUFFIX, GPU_SPECS, gpu_spec, use_cuda
from shardflow.errors import DEFAULT_ON_ERROR_READER, check_on_error
from shardflow.reader.split import EQUALIZE
from shardflow.reader.warn_once import warn_once

DEFAULT_SHUFFLE = 1000  # the shuffle buffer of shuffle=True, in samples

Fields = tuple[tuple[str, ...], ...]  # to_tuple: per output field, the entries to try in turn


def _option(default: Any, help: str, *, order: bool = False) -> Any:
    """A ReaderOptions field. `order`: the option decides the sample order, so a state dict's config
    records it (a state resumes only under the same values; the seed is recorded on its own)."""
    return field(default=default, metadata={"help": help, "order": order})


@dataclass(frozen=True)
class ReaderOptions:
    """The options of a ShardDataset as given, each with its default: `ShardDataset(spec, **options)`.

    Not here: the shard spec and manifest=, rewrite=, mirror= (ShardDataset's own keywords, see there).
    """

    # decoding
    decode: str | None = _option("torchrgb8", "image spec for the Decoder (torchrgb8, torchrgb, rgb8, pil, ...; "
                                 "None: raw bytes); +'-cuda': decode JPEGs on the GPU")
    only: Iterable[str] | str | None = _option(None, "decode only these members (passed to the Decoder)")
    allow_pickle: bool = _option(False, "decode .pickle/.pyd members (runs code from the data)")
    # order and batching
    shuffle: int | bool = _option(0, "shuffle-buffer size in samples (True: 1000; 0/False: keep order)", order=True)
    shardshuffle: bool | None = _option(None, "shuffle the shard order per epoch (None: when shuffle > 0)",
                                        order=True)
    batch_size: int | None = _option(None, "batch inside each worker (whole batches cross the process boundary)",
                                     order=True)
    partial: bool = _option(True, "keep each worker's last incomplete batch", order=True)
    collate: Callable[[list[Any]], Any] | None = _option(None, "collate function of batches (None: shardflow's "
                                                         "collate); yours runs seeded per batch, as map=")
    seed: int | None = _option(0, "the order is a function of (seed, epoch, rank, worker), map='s random draws of "
                               "(seed, epoch, key); None picks a seed (new draws every run)")
    resampled: bool = _option(False, "draw shards with replacement forever (epoch_size then bounds an epoch)",
                              order=True)
    epoch_size: int | None = _option(None, "samples per epoch over all ranks (fixes the count, for len() and "
                                     "resampled streams)", order=True)
    equalize: str | None = _option(None, "None, 'drop' or 'pad': the same number of samples (and batches) on "
                                   "every rank", order=True)
    map: Callable[[dict[str, Any]], Any] | None = _option(None, "fn(sample) -> sample or None (drop); raise "
                                                          "SkipSample to skip and count; random, numpy.random, "
                                                          "torch and sf.sample_rng(sample) seeded per sample")
    to_tuple: str | Sequence[str] | None = _option(None, "fields to return as a tuple, e.g. 'jpg;png cls' "
                                                   "('a;b': the first present)")
    # reading
    storage_options: dict[str, Any] | None = _option(None, "fsspec options (flat or per URL prefix)")
    cache_dir: str | None = _option(None, "a local LRU cache of remote shards (None: $WDS_CACHE when set, else "
                                    "no cache)")
    cache_size: int | str = _option("20GB", "the cache's size limit (default: $WDS_CACHE_SIZE bytes when set)")
    on_error: str = _option(DEFAULT_ON_ERROR_READER, "bad samples and damaged shards: 'raise', 'skip' or 'warn' "
                            "(skip and warn)")
    # splitting over ranks and workers
    split_by_node: bool = _option(True, "split the shards over the ranks", order=True)
    split_by_worker: bool = _option(True, "split each rank's shards over its DataLoader workers", order=True)
    rank: int | None = _option(None, "this rank (with world_size; default: torch.distributed, else RANK)")
    world_size: int | None = _option(None, "the number of ranks (with rank; default: torch.distributed, else "
                                     "WORLD_SIZE)")
    # GPU decode and batch memory
    gpu_decode: bool = _option(False, "decode JPEGs on the GPU, in the main process (as decode='...-cuda')")
    device: str | torch.device = _option("cuda", "the device GPU decode decodes on")
    channels_last: bool = _option(False, "image batches as (B, C, H, W) tensors in channels-last memory")
    allow_pipe: bool = _option(False, "allow pipe:CMD URLs (they run shell commands)")


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(ReaderOptions))
ORDER_OPTIONS = tuple(f.name for f in dataclasses.fields(ReaderOptions) if f.metadata["order"])


def option_help(name: str) -> str:
    """The one-line help of an option."""
    return next(f.metadata["help"] for f in dataclasses.fields(ReaderOptions) if f.name == name)


@dataclass(frozen=True)
class ReaderSettings:
    """The checked, resolved options of a ShardDataset (ReaderOptions says what each one does)."""

    # decoding
    decode: str | None
    only: Iterable[str] | str | None
    allow_pickle: bool
    gpu_decode: bool  # True only where a CUDA device exists (else the CPU decodes, with a warning)
    device: str | torch.device
    channels_last: bool
    map: Callable[[dict[str, Any]], Any] | None
    to_tuple: Fields | None
    # order, batching and splitting
    shuffle: int
    shardshuffle: bool
    seed: int
    resampled: bool
    epoch_size: int | None
    equalize: str | None
    batch_size: int | None
    partial: bool
    collate_fn: Callable[[list[Any]], Any] | None
    split_by_node: bool
    split_by_worker: bool
    rank_world: tuple[int, int] | None  # explicit rank= and world_size=
    # reading
    on_error: str
    storage_options: dict[str, Any] | None
    allow_pipe: bool
    cache_dir: str | None
    cache_size: int | str

    @classmethod
    def from_options(cls, options: ReaderOptions) -> ReaderSettings:
        """Check ShardDataset's options and resolve their shorthands (shuffle=True, seed=None,
        decode="...-cuda", to_tuple="a;b c", rank/world_size); raises ValueError naming the bad option.
        The options without a shorthand pass on under their own name."""
        o = options
        check_on_error(o.on_error)
        if o.equalize not in EQUALIZE:
            raise ValueError(f"equalize must be one of {EQUALIZE}, got {o.equalize!r}")
        if o.batch_size is not None and o.batch_size < 1:
            raise ValueError("batch_size must be >= 1 (or None)")
        if o.epoch_size is not None and o.epoch_size < 0:
            raise ValueError("epoch_size must be >= 0")
        if (o.rank is None) != (o.world_size is None):
            raise ValueError("give both rank= and world_size=, or neither")
        decode, gpu_decode = _decode_options(o.decode, o.gpu_decode, o.map)
        shuffle = int((DEFAULT_SHUFFLE if o.shuffle is True else o.shuffle) or 0)
        resolved = {
            "decode": decode, "gpu_decode": gpu_decode, "to_tuple": _parse_fields(o.to_tuple), "shuffle": shuffle,
            "shardshuffle": shuffle > 0 if o.shardshuffle is None else bool(o.shardshuffle),
            "seed": int.from_bytes(os.urandom(8), "little") if o.seed is None else int(o.seed),
            "collate_fn": o.collate,
            **_webdataset_cache(o.cache_dir, o.cache_size),
            "rank_world": None if o.rank is None else (int(o.rank), int(o.world_size)),  # type: ignore[arg-type]
        }
        same = {name: getattr(o, name) for name in _SETTING_NAMES if name not in resolved}
        return cls(**same, **resolved)

    def check_counts(self, counts_known: bool) -> None:
        """The options that need the shards' sample counts (from a manifest) or a fixed epoch_size."""
        if self.equalize is not None and not counts_known and self.epoch_size is None and not self.resampled:
            raise ValueError(
                "equalize= needs known sample counts: pass manifest= (a job's run directory or its "
                "summary.json) or epoch_size="
            )
        if self.resampled and self.equalize is not None and self.epoch_size is None:
            raise ValueError("equalize= with resampled=True needs epoch_size=")

    def order(self) -> dict[str, Any]:
        """The values (besides shards, seed and layout) that decide the sample order: the options marked
        `order` in ReaderOptions, resolved. A state dict's config records them."""
        return {name: getattr(self, name) for name in ORDER_OPTIONS}


_SETTING_NAMES = tuple(f.name for f in dataclasses.fields(ReaderSettings))


def _webdataset_cache(cache_dir: str | None, cache_size: int | str) -> dict[str, Any]:
    """cache_dir / cache_size, with webdataset's variables (WDS_CACHE, WDS_CACHE_SIZE in bytes) where the
    option was left at its default: a webdataset user's environment keeps its meaning."""
    if cache_dir is None and os.environ.get("WDS_CACHE"):
        cache_dir = os.environ["WDS_CACHE"]
    default_size = next(f.default for f in dataclasses.fields(ReaderOptions) if f.name == "cache_size")
    if cache_size == default_size and os.environ.get("WDS_CACHE_SIZE"):
        try:
            cache_size = int(float(os.environ["WDS_CACHE_SIZE"]))
        except ValueError:
            raise ValueError("WDS_CACHE_SIZE must be a number of bytes, "
                             f"got {os.environ['WDS_CACHE_SIZE']!r}") from None
    return {"cache_dir": cache_dir, "cache_size": cache_size}


def _decode_options(
    decode: str | None, gpu_decode: bool, map: Callable[..., Any] | None  # noqa: A002
) -> tuple[str | None, bool]:
    """(decode spec, GPU decode on): the "-cuda" suffix (or its deprecated alias "-gpu") resolved by
    codecs.gpu, the jobs' parser, and GPU decode only with a GPU (the reader always falls back)."""
    # said where the user built the dataset: gpu_spec < here < from_options < ShardDataset < user
    base = gpu_spec(decode, stacklevel=4)
    if base is not None:
        decode, gpu_decode = base, True
    if decode is not None and decode not in IMAGE_SPECS:
        raise ValueError(f"unknown decode spec {decode!r}; use None or one of: {', '.join(IMAGE_SPECS)} "
                         f"(+'{CUDA_SUFFIX}')")
    if not gpu_decode:
        return decode, False
    if decode not in GPU_SPECS:
        raise ValueError(f"GPU decode produces {sorted(GPU_SPECS)} tensors, not {decode!r}")
    if map is not None:
        raise ValueError(
            "map= runs in the workers, before a GPU decode would happen; use gpu_decode with "
            "to_tuple only and transform the decoded batch on the GPU"
        )
    if use_cuda(f"decode='{decode}{CUDA_SUFFIX}'", fallback=True):
        return decode, True
    # said where the user built the dataset: warn_once < here < from_options < ShardDataset < user
    warn_once(f"decode={decode}{CUDA_SUFFIX}: no CUDA device here, decoding JPEGs on the CPU instead", stacklevel=5)
    return decode, False


def _parse_fields(to_tuple: str | Sequence[str] | None) -> Fields | None:
    """"jpg;png cls" -> (("jpg", "png"), ("cls",)): per output field, the entries to try in turn."""
    if to_tuple is None:
        return None
    if isinstance(to_tuple, str):
        to_tuple = to_tuple.split()
    return tuple(tuple(f.split(";")) for f in to_tuple)
