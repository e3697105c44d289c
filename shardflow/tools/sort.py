"""Sorting the samples of a shard (`shardflow sort`), stable, in bounded memory.

SortSamples is a job's fn with an `arrange_samples` stage (run_task applies it to each input
shard's sample stream): samples are collected until `memory` bytes of members are held, then that
run is sorted and spilled to a temp file (pickle records); at the end the runs are merged with
heapq.merge. Records carry their input position, so equal keys keep their input order (stable)
across runs. A shard that fits in memory is sorted in memory and never touches the disk.
"""

from __future__ import annotations

import heapq
import os
import pickle
import tempfile
from typing import Any, BinaryIO, Iterator

from shardflow.errors import SampleError
from shardflow.tools.fields import FieldError, field_value, sort_key

DEFAULT_MEMORY = 1 << 30


def passthrough(sample: dict[str, Any]) -> dict[str, Any]:
    """The per-sample fn of split/cat/sort: samples copied byte for byte."""
    return sample


class SortSamples:
    """fn + stream stage ordering each input shard's samples by `by` (`key` or a field such as
    `json.label`), ascending or `reverse`; samples missing the field go last."""

    __name__ = "sort"

    def __init__(self, by: str = "key", *, memory: float = DEFAULT_MEMORY, reverse: bool = False,
                 tmpdir: str | None = None) -> None:
        if memory < 1:
            raise ValueError("memory must be at least 1 byte")
        self.by = by
        self.memory = int(memory)
        self.reverse = reverse
        self.tmpdir = tmpdir

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return sample

    def key_of(self, sample: dict[str, Any]) -> tuple[int, Any]:
        """The sort key of a sample (missing values last in either direction)."""
        try:
            value = field_value(sample, self.by)
        except FieldError as exc:
            raise SampleError(f"cannot sort by {self.by!r}: {exc}", url=sample.get("__url__"),
                              key=sample.get("__key__")) from None
        if self.by in ("key", "__key__"):
            order: tuple[int, Any] = (1, value)
        else:
            order = sort_key(value)
        if self.reverse and value is not None:
            return (0, _Reversed(order))
        return (1, 0) if value is None else (0, order)

    def arrange_samples(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The samples of one shard in sorted order (external merge sort past `memory` bytes)."""
        with tempfile.TemporaryDirectory(prefix="shardflow-sort-", dir=self.tmpdir) as spill:
            runs: list[str] = []
            batch: list[tuple[Any, int, dict[str, Any]]] = []
            held = 0
            for position, sample in enumerate(samples):
                batch.append((self.key_of(sample), position, sample))
                held += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
                if held >= self.memory:
                    runs.append(_spill(sorted(batch, key=_order), spill, len(runs)))
                    batch, held = [], 0
            batch.sort(key=_order)
            if not runs:
                yield from (sample for _, _, sample in batch)
                return
            streams = [_read_run(path) for path in runs] + [iter(batch)]
            for _, _, sample in heapq.merge(*streams, key=_order):
                yield sample


def _order(record: tuple[Any, int, dict[str, Any]]) -> tuple[Any, int]:
    return record[0], record[1]


class _Reversed:
    """Inverts the order of a key (for --reverse) while positions keep ties stable."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: "_Reversed") -> bool:
        return other.value < self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and other.value == self.value


def _spill(records: list[tuple[Any, int, dict[str, Any]]], directory: str, index: int) -> str:
    """Write one sorted run; returns its path."""
    path = os.path.join(directory, f"run-{index:06d}.pkl")
    with open(path, "wb") as f:
        for record in records:
            pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _read_run(path: str) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """The records of a run this process spilled (our own pickles, never input data as pickle)."""
    with open(path, "rb") as f:
        yield from _records(f)


def _records(f: BinaryIO) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    while True:
        try:
            yield pickle.load(f)
        except EOFError:
            return
