"""Per-chunk summaries: the merged stats and shards of a range of tasks that are all done.

`summaries/000001000-000002000.json` says tasks [1000, 2000) are done, with their merged Stats and
their output shards in task order. A range is summarised only once every task in it is done, and
markers are never removed except by a reset (which removes summaries too), so a summary stays true.
Pods write one for their chunk when it ends with every task done; the driver and `worker --finalize`
write one per SPAN-aligned range in build_report. Status and reports then read a few summaries
instead of one marker per task (O(N / SPAN) reads at any N), and markers only where no summary is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from shardflow.rundir.layout import SUMMARIES, RunFiles, done_file
from shardflow.rundir.stats import Stats

SPAN = 1_000  # tasks per summary written by the driver / finalize


def summary_name(first: int, stop: int) -> str:
    return f"{SUMMARIES}/{first:09d}-{stop:09d}.json"


def _parse_name(name: str) -> tuple[int, int] | None:
    stem = name[:-5] if name.endswith(".json") else ""
    first, dash, stop = stem.partition("-")
    if not (dash and first.isdigit() and stop.isdigit()) or int(stop) <= int(first):
        return None
    return int(first), int(stop)


@dataclass
class Block:
    """Tasks [first, stop), all done: their merged stats and shards (in task order)."""

    first: int
    stop: int
    stats: Stats = field(default_factory=Stats)
    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.stop - self.first

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "stop": self.stop, "stats": self.stats.to_json(), "shards": self.shards}


def write_block(run_dir: RunFiles, block: Block) -> None:
    run_dir.write_json(summary_name(block.first, block.stop), block.to_json())


def block_of(first: int, stop: int, parts: Iterable[tuple[Stats, list[dict[str, Any]]]]) -> Block:
    """A Block from the (stats, outputs) of each of its tasks, in task order."""
    block = Block(first, stop)
    for stats, outputs in parts:
        block.stats.merge(stats)
        block.shards.extend(outputs)
    return block


def summary_ranges(names: Iterable[str]) -> list[tuple[int, int]]:
    """Non-overlapping (first, stop) ranges of the summaries named, in order (larger ones preferred)."""
    ranges = sorted((r for r in map(_parse_name, names) if r), key=lambda r: (r[0], -r[1]))
    chosen: list[tuple[int, int]] = []
    cursor = 0
    for first, stop in ranges:
        if first >= cursor:
            chosen.append((first, stop))
            cursor = stop
    return chosen


def read_blocks(run_dir: RunFiles, tasks: int) -> dict[int, Block]:
    """Non-overlapping summaries inside [0, tasks), keyed by first task id (larger ranges preferred)."""
    chosen = [r for r in summary_ranges(run_dir.list_names(SUMMARIES)) if r[1] <= tasks]
    blocks: dict[int, Block] = {}
    for (first, stop), record in zip(chosen, run_dir.read_many([summary_name(f, s) for f, s in chosen])):
        if record is not None:
            blocks[first] = Block(first, stop, Stats.from_json(record.get("stats", {})), record.get("shards", []))
    return blocks


class SpanWriter:
    """Collects consecutive done tasks and writes a summary for each SPAN-aligned range found whole."""

    def __init__(self, run_dir: RunFiles, tasks: int, existing: Iterable[tuple[int, int]]) -> None:
        self.run_dir, self.tasks, self.existing = run_dir, tasks, set(existing)
        self.block: Block | None = None
        self.count = 0
        self.written = 0

    def add(self, first: int, size: int, stats: Stats, shards: list[dict[str, Any]]) -> None:
        """Tasks [first, first + size) are done with these merged stats and shards."""
        start = first - first % SPAN
        if self.block is None or self.block.first != start:
            self.flush()
            self.block, self.count = Block(start, min(start + SPAN, self.tasks)), 0
        if first + size > self.block.stop:  # a pod's chunk across a SPAN boundary: leave this range
            self.count = -self.tasks
            return
        self.block.stats.merge(stats)
        self.block.shards.extend(shards)
        self.count += size

    def flush(self) -> None:
        block, self.block = self.block, None
        if block is not None and self.count == block.size and (block.first, block.stop) not in self.existing:
            write_block(self.run_dir, block)
            self.written += 1


def merged_done(run_dir: RunFiles, tasks: int, done_ids: set[int]) -> tuple[Stats, int]:
    """Merged stats and shard count of the done tasks of a plan of tasks 0..tasks-1: summaries where
    they exist, markers (fetched in batches) elsewhere."""
    stats, shards = Stats(), 0
    covered = [False] * tasks
    for block in read_blocks(run_dir, tasks).values():
        stats.merge(block.stats)
        shards += len(block.shards)
        covered[block.first:block.stop] = [True] * block.size
    rest = sorted(t for t in done_ids if 0 <= t < tasks and not covered[t])
    for record in run_dir.read_many([done_file(t) for t in rest]):
        if record is not None:
            stats.merge(Stats.from_json(record.get("stats", {})))
            shards += len(record.get("outputs", []))
    return stats, shards
