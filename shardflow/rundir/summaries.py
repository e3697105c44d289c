"""Per-chunk summaries: the merged stats and shards of a range of tasks that are all done.

`summaries/000001000-000002000.json` says tasks [1000, 2000) are done, with their merged Stats and
their output shards in task order. A range is summarised only once every task in it is done, and
markers are removed only by a reset (which removes summaries too) or by a retry of the tasks that
dropped samples (rundir.retry, which removes every summary holding one of them first), so a summary
stays true.
Pods write one for their chunk when it ends with every task done; the driver and `worker --finalize`
write one per SPAN-aligned range in build_report. Status and reports then read a few summaries
instead of one marker per task (O(N / SPAN) reads at any N), and markers only where no summary is.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence, Union

from shardflow.rundir.layout import SUMMARIES, RunFiles, done_file
from shardflow.rundir.state_files import loads_or_none
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


def summaries_holding(names: Iterable[str], ids: Sequence[int]) -> list[str]:
    """The summary names (as listed in summaries/, every one, overlapping or not) whose range holds one
    of the sorted task `ids`: what must go before those tasks' markers do (rundir.retry)."""
    held = []
    for name in names:
        found = _parse_name(name)
        if found is not None:
            at = bisect.bisect_left(ids, found[0])
            if at < len(ids) and ids[at] < found[1]:
                held.append(name)
    return held


def span_prefix(first: int) -> str:
    """The name prefix shared by every summary starting in first's SPAN range (and by no other)."""
    digits = len(str(SPAN)) - 1  # SPAN is a power of ten: its ranges are the names' leading digits
    return summary_name(first - first % SPAN, 0).rpartition("/")[2][:9 - digits]


def merge_span(run_dir: RunFiles, first: int, tasks: int) -> bool:
    """Write the SPAN summary of first's SPAN range when the summaries in it tile the range whole: what
    the pod whose chunk completes a range does, so a report after an Indexed Job reads tasks / SPAN
    summaries instead of one per pod (10,000 GETs at 100k tasks, pods of 10). One listing of the range's
    names; their reads and the write only when it is whole. Two pods may both find it whole and write the
    same summary (the write is atomic, the content the same); a range both miss is merged by the next
    report as before. Returns whether it wrote it."""
    start = first - first % SPAN
    stop = min(start + SPAN, tasks)
    names = run_dir.list_names(SUMMARIES, prefix=span_prefix(start))
    ranges = [r for r in summary_ranges(names) if start <= r[0] and r[1] <= stop]
    if not ranges or ranges == [(start, stop)] or not _tiles(ranges, start, stop):
        return False
    records = _summaries(run_dir, [summary_name(f, s) for f, s in ranges])
    if any(not isinstance(r, dict) or not isinstance(r.get("shards"), list) for r in records):
        return False  # gone meanwhile (a reset) or not a summary: leave it to the report
    write_block(run_dir, block_of(start, stop, ((Stats.from_json(r.get("stats", {})), r["shards"]) for r in records)))
    return True


def _tiles(ranges: list[tuple[int, int]], start: int, stop: int) -> bool:
    cursor = start
    for first, end in ranges:
        if first != cursor:
            return False
        cursor = end
    return cursor == stop


def numbered_from_zero(ids: Sequence[int]) -> bool:
    """Whether task ids are 0..n-1 in order, as every plan numbers them: summaries name ranges of them."""
    if isinstance(ids, range):
        return ids.start == 0 and ids.step == 1
    return all(i == t for i, t in enumerate(ids))


class LiveSpans:
    """Writes each SPAN range's summary as soon as this run has finished every task of it.

    A driver killed mid-run (SIGKILL, OOM, a lost node) writes no report; without these its next run
    read one marker per task done (100,000 GETs at 100k tasks on S3). With them it reads N / SPAN
    summaries and the markers of the ranges that were in flight. A range with a task done before this
    run is left to the report (that task's entries are in its marker); a write that fails is too (best
    effort: the report writes what is missing). `written`: the ranges written, which the report's
    SpanWriter then does not write again."""

    def __init__(self, run_dir: RunFiles, ids: Sequence[int], pending: Iterable[int]) -> None:
        self.run_dir = run_dir
        self.tasks = len(ids)
        self.written: set[int] = set()
        # range start -> how many of its tasks this run has yet to finish (a backend yields each task once)
        self.left: dict[int, int] = {}
        if not numbered_from_zero(ids):
            return  # a plan not numbered 0..n-1 (none is): the report does it all
        for task_id in pending:
            start = task_id - task_id % SPAN
            self.left[start] = self.left.get(start, 0) + 1
        for start in [s for s, left in self.left.items() if left != min(s + SPAN, self.tasks) - s]:
            del self.left[start]  # part of the range was done before this run

    def finished(self, result: Any, results: dict[int, Any]) -> None:
        """`result` (a TaskResult, also in `results`) came in: write its range's summary if now whole."""
        start = result.task_id - result.task_id % SPAN
        if start not in self.left:
            return
        if result.status == "failed":
            del self.left[start]  # not whole in this run
            return
        self.left[start] -= 1
        if self.left[start]:
            return
        del self.left[start]
        stop = min(start + SPAN, self.tasks)
        try:
            write_block(self.run_dir, block_of(start, stop, ((results[t].stats, results[t].outputs)
                                                             for t in range(start, stop))))
        except Exception:  # noqa: BLE001 - best effort: the report writes it
            return
        self.written.add(start)


READ_TASKS = 4_000  # tasks' worth of summaries fetched (concurrently) and parsed at a time: memory flat at any N


@dataclass
class Summary:
    """A per-chunk summary as read back: its range, merged stats and shard count. `shards` is kept only
    where asked (a summary about to be merged into a SPAN summary); the report refers to the file by
    `name` otherwise and reads it again when its shards are iterated."""

    first: int
    stop: int
    stats: Stats
    count: int
    shards: list[dict[str, Any]] | None = None

    @property
    def size(self) -> int:
        return self.stop - self.first

    @property
    def name(self) -> str:
        return summary_name(self.first, self.stop)


def read_summaries(run_dir: RunFiles, tasks: int, *, skip: Callable[[int, int], bool] = lambda f, s: False,
                   keep_shards: Callable[[int, int], bool] = lambda f, s: False) -> Iterator[Summary]:
    """Non-overlapping summaries inside [0, tasks), in order (larger ranges preferred), but for the
    ranges `skip` names; read READ_TASKS tasks' worth at a time (concurrently on object stores), so
    memory stays flat: only the stats and shard counts are kept, the shards where `keep_shards` says.
    A summary gone since the listing is left out (its tasks are read from their markers)."""
    chosen = [r for r in summary_ranges(run_dir.list_names(SUMMARIES)) if r[1] <= tasks and not skip(*r)]
    start = 0
    while start < len(chosen):
        end, size = start, 0
        while end < len(chosen) and (end == start or size + chosen[end][1] - chosen[end][0] <= READ_TASKS):
            size += chosen[end][1] - chosen[end][0]
            end += 1
        batch = chosen[start:end]
        for (first, stop), record in zip(batch, _summaries(run_dir, [summary_name(f, s) for f, s in batch])):
            if record is not None:
                shards = record.get("shards") or []
                yield Summary(first, stop, Stats.from_json(record.get("stats", {})), len(shards),
                              shards if keep_shards(first, stop) else None)
        start = end


Piece = Union[Summary, list]  # a summary read back, or shard entries in memory (a task's outputs)


class SpanWriter:
    """Collects consecutive done tasks and writes a summary for each SPAN-aligned range found whole.

    `flush` hands each span's pieces to `emit` in order: the span's new summary when it was written
    (unless a piece was added `kept`: this run's outputs as its tasks returned them, URLs unredacted),
    otherwise what was added (in-memory entries of consecutive tasks joined into one list), so a
    caller can keep references to files instead of a million shard entries."""

    def __init__(self, run_dir: RunFiles, tasks: int, emit: Callable[[Piece], None],
                 written: Collection[int] = frozenset()) -> None:
        self.run_dir, self.tasks, self.emit = run_dir, tasks, emit
        self.already = written  # ranges whose summary this run wrote as it went (LiveSpans)
        self.first: int | None = None
        self.pieces: list[Piece] = []
        self.stats = Stats()
        self.count = 0
        self.kept = False
        self.written = 0

    @staticmethod
    def merges(first: int, stop: int, tasks: int) -> bool:
        """Whether a summary of [first, stop) would be merged into a bigger SPAN summary (its shards
        are then needed): it lies inside one SPAN range and is not that whole range."""
        start = first - first % SPAN
        return stop <= start + SPAN and (first, stop) != (start, min(start + SPAN, tasks))

    def add(self, first: int, size: int, stats: Stats, piece: Piece, *, kept: bool = False) -> None:
        """Tasks [first, first + size) are done with these merged stats and shard entries."""
        start = first - first % SPAN
        if self.first != start:
            self.flush()
            self.first, self.count = start, 0
        self.pieces.append(piece)
        self.kept |= kept
        if first + size > min(start + SPAN, self.tasks):  # a pod's chunk across a SPAN boundary: leave this range
            self.count = -self.tasks
            return
        self.stats.merge(stats)
        self.count += size

    def flush(self) -> None:
        first, pieces, stats, kept = self.first, self.pieces, self.stats, self.kept
        self.first, self.pieces, self.stats, self.kept = None, [], Stats(), False
        if first is None:
            return
        stop = min(first + SPAN, self.tasks)
        whole = self.count == stop - first
        if whole and first not in self.already and not (len(pieces) == 1 and isinstance(pieces[0], Summary)
                                                        and pieces[0].size == stop - first):
            block = Block(first, stop, stats, [e for p in pieces for e in self._entries(p)])
            write_block(self.run_dir, block)
            self.written += 1
            if not kept:
                self.emit(Summary(first, stop, stats, len(block.shards)))
                return
        entries: list[dict[str, Any]] | None = None
        for piece in pieces:
            if isinstance(piece, list):
                if entries is None:
                    entries = list(piece)  # a copy: the task's own outputs list is not extended
                else:
                    entries.extend(piece)
                continue
            if entries is not None:
                self.emit(entries)
                entries = None
            self.emit(Summary(piece.first, piece.stop, piece.stats, piece.count))  # shards dropped: read again
        if entries is not None:
            self.emit(entries)

    def _entries(self, piece: Piece) -> list[dict[str, Any]]:
        if isinstance(piece, list):
            return piece
        if piece.shards is not None:
            return piece.shards
        return list(self.run_dir.read_json(piece.name).get("shards") or [])


def _summaries(run_dir: RunFiles, names: list[str]) -> list[Any]:
    """Summaries read back; one that is unreadable (torn, not JSON) reads as missing: its tasks are merged
    from their done markers instead, as for a summary never written (rundir.state_files)."""
    return [loads_or_none(text) for text in run_dir.read_many(names, parse=False)]


def merged_done(run_dir: RunFiles, tasks: int, done_ids: set[int]) -> tuple[Stats, int]:
    """Merged stats and shard count of the done tasks of a plan of tasks 0..tasks-1: summaries where
    they exist, markers (fetched in batches) elsewhere."""
    stats, shards = Stats(), 0
    covered = [False] * tasks
    for summary in read_summaries(run_dir, tasks):
        stats.merge(summary.stats)
        shards += summary.count
        covered[summary.first:summary.stop] = [True] * summary.size
    rest = sorted(t for t in done_ids if 0 <= t < tasks and not covered[t])
    for record in run_dir.read_many([done_file(t) for t in rest]):
        if record is not None:
            stats.merge(Stats.from_json(record.get("stats", {})))
            shards += len(record.get("outputs", []))
    return stats, shards
