"""Sorting the samples of a shard (`shardflow sort`), stable, in bounded memory.

SortSamples is a job's fn with an `arrange_samples` stage (run_task applies it to each input
shard's sample stream): samples are collected until `memory` bytes of members are held, then that
run is sorted and spilled to a temp file (pickle records); at the end the runs are merged with
heapq.merge. Records carry their input position, so equal keys keep their input order (stable)
across runs. A shard that fits in memory is sorted in memory and never touches the disk.

Spilled runs hold the samples themselves, so a sort killed mid-spill (SIGKILL, OOM, a lost node) must
not leave them in $TMPDIR forever: each spill folder (`shardflow-sort-*`, mode 0700) holds a `lock`
file that its sort keeps flock()ed while it lives (the lock is taken before the file gets its name, so a
folder is never seen unlocked while in use), and every sort starts by removing the folders of its user
whose lock it can take, i.e. whose sort is gone (a lock dies with its process; PID namespaces and
reused pids do not matter). A folder without a lock file is removed once an hour old.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import math
import os
import pickle
import shutil
import tempfile
import time
from typing import Any, BinaryIO, Iterator

from shardflow.errors import SampleError
from shardflow.text import safe
from shardflow.tools.fields import FieldError, field_value, sort_key

DEFAULT_MEMORY = 1 << 30
SPILL_PREFIX = "shardflow-sort-"
_LOCK = "lock"
_UNLOCKED_STALE_AFTER = 3600.0  # seconds: a spill folder that never got its lock (killed at once)
_KEY_ERROR = "__sort_error__"  # why a sample's sort field could not be read (raised by __call__)


class SortFieldError(SampleError):
    """A sample whose sort field cannot be read (its JSON is bad). The reason names shard, key, field and
    why: no traceback is kept (the frames are shardflow's own), and when every sample has it the run
    stops with `every_sample_failed`'s message, not as a bug in process()."""

    hide_traceback = True

    @staticmethod
    def every_sample_failed(first: dict[str, Any], failed: int, total: int) -> str:
        """The run's message when no sample's field could be read (task.failures.user_bug)."""
        return (f"the sort field could not be read in any sample ({failed} of {total}), e.g. shard "
                f"{safe(first['shard'])}, key {first['key']!r}: {safe(first['reason'])}")


def passthrough(sample: dict[str, Any]) -> dict[str, Any]:
    """The per-sample fn of split/cat/sort: samples copied byte for byte."""
    return sample


class SortSamples:
    """fn + stream stage ordering each input shard's samples by `by` (`key` or a field such as
    `json.label`), ascending or `reverse`; samples missing the field go last."""

    __name__ = "sort"

    def __init__(self, by: str = "key", *, memory: float = DEFAULT_MEMORY, reverse: bool = False,
                 tmpdir: str | None = None) -> None:
        if not math.isfinite(memory) or memory < 1:
            raise ValueError(f"memory must be a number of bytes >= 1, not {memory!r}")
        self.by = by
        self.memory = int(memory)
        self.reverse = reverse
        self.tmpdir = tmpdir

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        error = sample.get(_KEY_ERROR)
        if error is not None:  # its field could not be read: the job's on_error decides (see key_of)
            raise SortFieldError(error, url=sample.get("__url__"), key=sample.get("__key__"))
        return sample

    def key_of(self, sample: dict[str, Any]) -> tuple[int, Any]:
        """The sort key of a sample (missing values last in either direction).

        A sample whose field cannot be read (bad JSON) is not the whole shard's problem: it is sorted
        after every other (even those without the field), carrying the reason, and __call__ raises it as
        that sample's SampleError, so on_error applies as to any bad sample: skip drops and logs it, raise
        fails the task with one line naming shard and key."""
        try:
            value = field_value(sample, self.by)
        except FieldError as exc:
            sample[_KEY_ERROR] = f"cannot sort by {self.by!r}: {exc}"
            return (2, 0)
        if self.by in ("key", "__key__"):
            order: tuple[int, Any] = (1, value)
        else:
            order = sort_key(value)
        if self.reverse and value is not None:
            return (0, _Reversed(order))
        return (1, 0) if value is None else (0, order)

    def arrange_samples(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The samples of one shard in sorted order (external merge sort past `memory` bytes)."""
        with spill_folder(self.tmpdir) as spill:
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


@contextlib.contextmanager
def spill_folder(tmpdir: str | None) -> Iterator[str]:
    """A private folder for spilled runs, locked while it is in use, removed after; stale folders of
    sorts that died are removed first."""
    base = tmpdir or tempfile.gettempdir()
    remove_stale_spills(base)
    path = tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=base)
    fd = -1
    try:
        fd = os.open(os.path.join(path, ".lock-new"), os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(os.path.join(path, ".lock-new"), os.path.join(path, _LOCK))  # named only once locked
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def remove_stale_spills(base: str) -> int:
    """Remove this user's spill folders under `base` whose sort is gone; returns how many."""
    removed = 0
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(SPILL_PREFIX)]
    except OSError:
        return 0
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
            continue
        try:
            fd = os.open(os.path.join(entry.path, _LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            if time.time() - info.st_mtime > _UNLOCKED_STALE_AFTER:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its sort is alive
            os.close(fd)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(fd)
        removed += 1
    return removed


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
