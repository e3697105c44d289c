"""ReaderSettings: the options of a ShardDataset, checked once and then fixed.

Everything the reader does follows from these values (plus the shard list and its manifest), so
they are one frozen record: a DataLoader worker gets them by pickling, a state dict fingerprints
the ones that decide the order, and a changed option is a new record (dataclasses.replace), never a
half-updated object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from shardflow.codecs import IMAGE_SPECS
from shardflow.errors import check_on_error
from shardflow.reader.gpu import GPU_SPECS, GPU_SUFFIX
from shardflow.reader.split import EQUALIZE
from shardflow.reader.warn_once import warn_once

DEFAULT_SHUFFLE = 1000  # the shuffle buffer of shuffle=True, in samples

Fields = tuple[tuple[str, ...], ...]  # to_tuple: per output field, the entries to try in turn


@dataclass(frozen=True)
class ReaderSettings:
    """The validated options of ShardDataset (see its docstring for what each one does)."""

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
    def from_options(
        cls, *, decode: str | None, only: Iterable[str] | str | None, allow_pickle: bool, shuffle: int | bool,
        shardshuffle: bool | None, batch_size: int | None, partial: bool, collate: Callable[[list[Any]], Any] | None,
        seed: int | None, resampled: bool, epoch_size: int | None, equalize: str | None,
        map: Callable[[dict[str, Any]], Any] | None, to_tuple: str | Sequence[str] | None,  # noqa: A002
        storage_options: dict[str, Any] | None, cache_dir: str | None, cache_size: int | str, on_error: str,
        split_by_node: bool, split_by_worker: bool, rank: int | None, world_size: int | None, gpu_decode: bool,
        device: str | torch.device, channels_last: bool, allow_pipe: bool,
    ) -> ReaderSettings:
        """Check ShardDataset's keyword arguments and resolve their shorthands (shuffle=True, seed=None,
        decode="...-gpu", to_tuple="a;b c"); raises ValueError naming the bad option."""
        check_on_error(on_error)
        if equalize not in EQUALIZE:
            raise ValueError(f"equalize must be one of {EQUALIZE}, got {equalize!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be >= 1 (or None)")
        if epoch_size is not None and epoch_size < 0:
            raise ValueError("epoch_size must be >= 0")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank= and world_size=, or neither")
        decode, gpu_decode = _decode_options(decode, gpu_decode, map)
        shuffle = int((DEFAULT_SHUFFLE if shuffle is True else shuffle) or 0)
        return cls(
            decode=decode, only=only, allow_pickle=allow_pickle, gpu_decode=gpu_decode, device=device,
            channels_last=channels_last, map=map, to_tuple=_parse_fields(to_tuple),
            shuffle=shuffle, shardshuffle=shuffle > 0 if shardshuffle is None else bool(shardshuffle),
            seed=int.from_bytes(os.urandom(8), "little") if seed is None else int(seed),
            resampled=resampled, epoch_size=epoch_size, equalize=equalize, batch_size=batch_size,
            partial=partial, collate_fn=collate, split_by_node=split_by_node, split_by_worker=split_by_worker,
            rank_world=None if rank is None else (int(rank), int(world_size)),  # type: ignore[arg-type]
            on_error=on_error, storage_options=storage_options, allow_pipe=allow_pipe,
            cache_dir=cache_dir, cache_size=cache_size,
        )

    def check_counts(self, counts_known: bool) -> None:
        """The options that need the shards' sample counts (from a manifest) or a fixed epoch_size."""
        if self.equalize is not None and not counts_known and self.epoch_size is None and not self.resampled:
            raise ValueError(
                "equalize= needs known sample counts: pass manifest= (a job's run directory or its "
                "summary.json) or epoch_size="
            )
        if self.resampled and self.equalize is not None and self.epoch_size is None:
            raise ValueError("equalize= with resampled=True needs epoch_size=")


def _decode_options(
    decode: str | None, gpu_decode: bool, map: Callable[..., Any] | None  # noqa: A002
) -> tuple[str | None, bool]:
    """(decode spec, GPU decode on): the "-gpu" suffix resolved, and GPU decode only with a GPU."""
    if isinstance(decode, str) and decode.endswith(GPU_SUFFIX):
        decode, gpu_decode = decode[: -len(GPU_SUFFIX)], True
    if decode is not None and decode not in IMAGE_SPECS:
        raise ValueError(f"unknown decode spec {decode!r}; use None or one of: {', '.join(IMAGE_SPECS)} (+'-gpu')")
    if not gpu_decode:
        return decode, False
    if decode not in GPU_SPECS:
        raise ValueError(f"GPU decode produces {sorted(GPU_SPECS)} tensors, not {decode!r}")
    if map is not None:
        raise ValueError(
            "map= runs in the workers, before a GPU decode would happen; use gpu_decode with "
            "to_tuple only and transform the decoded batch on the GPU"
        )
    if torch.cuda.is_available():
        return decode, True
    # said where the user built the dataset: warn_once < here < from_options < ShardDataset < user
    warn_once(f"decode={decode}-gpu: no CUDA device here, decoding JPEGs on the CPU instead", stacklevel=5)
    return decode, False


def _parse_fields(to_tuple: str | Sequence[str] | None) -> Fields | None:
    """"jpg;png cls" -> (("jpg", "png"), ("cls",)): per output field, the entries to try in turn."""
    if to_tuple is None:
        return None
    if isinstance(to_tuple, str):
        to_tuple = to_tuple.split()
    return tuple(tuple(f.split(";")) for f in to_tuple)
