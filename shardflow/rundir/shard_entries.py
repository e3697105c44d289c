"""ShardEntries: a run's output shard entries, in task order, without holding them all in memory.

A report at a million tasks would otherwise keep a million shard dicts (~1 GB) although most callers
only count them and summary.json is written once. The entries are kept as parts: lists in memory
(what this run's tasks returned, markers read now) and references to per-chunk summaries (their
shards are read again, a few files at a time, whenever the sequence is iterated). It behaves as a
read-only list: len, iteration, indexing, slicing, equality with a list.

The summaries referred to are never rewritten while their tasks stay done (rundir/summaries.py); a
reset of the run directory (`redo`) removes them, after which iterating an older report fails with
a JobError that says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Iterator, Union, overload

from shardflow.errors import JobError
from shardflow.rundir.layout import RunFiles
from shardflow.rundir.summaries import READ_TASKS, Summary

Part = Union[list, Summary]


class ShardEntries(Sequence):
    """The output shard entries of a run, in task order (a read-only list; see the module's doc)."""

    def __init__(self, run_dir: RunFiles | None = None, entries: list[dict[str, Any]] | None = None) -> None:
        self._run_dir = run_dir
        self._parts: list[Part] = []
        self._ends: list[int] = []  # cumulative entry count at the end of each part
        if entries:
            self.append(entries)

    def append(self, part: Part) -> None:
        """Entries in memory (a list, kept as given: not copied) or a summary read back (by reference)."""
        count = len(part) if isinstance(part, list) else part.count
        if not count:
            return
        if isinstance(part, Summary) and self._run_dir is None:
            raise ValueError("ShardEntries refers to summaries only with a run directory to read them from")
        self._parts.append(part if isinstance(part, list) else Summary(part.first, part.stop, part.stats, count))
        self._ends.append(len(self) + count)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for entries in self._lists(0, len(self._parts)):
            yield from entries

    def _lists(self, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        """The entries of parts [start, stop) as lists; summaries read READ_TASKS entries' worth at a time."""
        index = start
        while index < stop:
            part = self._parts[index]
            if isinstance(part, list):
                yield part
                index += 1
                continue
            batch: list[Summary] = []
            size = 0
            while index < stop and isinstance(self._parts[index], Summary) and (not batch or size < READ_TASKS):
                batch.append(self._parts[index])
                size += batch[-1].count
                index += 1
            assert self._run_dir is not None
            for summary, record in zip(batch, self._run_dir.read_many([s.name for s in batch])):
                shards = record.get("shards") if isinstance(record, dict) else None
                if not isinstance(shards, list) or len(shards) != summary.count:
                    raise JobError(f"{summary.name} in the run directory is gone or changed since this report was "
                                   "made (a --redo or reset since?): its shard entries cannot be read again")
                yield shards

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self._range(start, stop)[::step] if step > 0 else list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("shard entry index out of range")
        part = bisect.bisect_right(self._ends, index)
        start = self._ends[part - 1] if part else 0
        return next(self._lists(part, part + 1))[index - start]

    def _range(self, start: int, stop: int) -> list[dict[str, Any]]:
        if stop <= start:
            return []
        first = bisect.bisect_right(self._ends, start)
        last = bisect.bisect_right(self._ends, stop - 1)
        out: list[dict[str, Any]] = []
        offset = self._ends[first - 1] if first else 0
        for entries in self._lists(first, last + 1):
            out.extend(entries[max(0, start - offset):stop - offset])
            offset += len(entries)
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardEntries) or (isinstance(other, Sequence) and not isinstance(other, (str, bytes))):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares by content, like the list it stands for

    def __repr__(self) -> str:
        return f"ShardEntries({len(self)} entries in {len(self._parts)} parts)"
