"""Split keys in a job: a key whose members are not adjacent in an input shard is never written.

The reader (shards/samples.py) streams: it can only tell a key is split when it meets the key's
second part, after the first part went out as a sample that may lack members; it reports the key
and goes on ("reported, not held back"). A task can hold the guarantee, because nothing it writes
counts before its done marker: when a task under skip met a split key, it runs again from a clean
state with that key left out (reported once per shard as a failed sample), and the shards its first
run published are removed before the rerun writes its own. Under raise the reader raises at the
second part and the task fails: nothing is committed either way.

The hooks in run_task: `read_samples` (this module's, with the reader's signature) watches and
filters; `check_split_keys` after the task's samples are written, before its marker; `without_split_keys`
around one attempt. The state of the attempt in progress is a context variable, so threads the
task starts with copied contexts (batch, overlap) see it too.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from shardflow.errors import RAISE, SampleError, ShardflowError
from shardflow.shards.keys import Sample
from shardflow.shards.samples import read_samples as _read_samples
from shardflow.storage.paths import filesystem

T = TypeVar("T")
ErrorSink = Callable[[ShardflowError], None]

_REAPPEARS = "key reappears later"  # the reader's report of a split key (shards/samples.py)


class SplitKeysFound(Exception):
    """An attempt met split keys it did not leave out: the task runs again without them."""

    def __init__(self, keys: frozenset[tuple[str, str]], outputs: list[str]) -> None:
        super().__init__(f"{len(keys)} split key(s): the task runs again without them")
        self.keys = keys  # (input shard url, key)
        self.outputs = outputs  # the shards the attempt published


@dataclass
class _Attempt:
    excluded: frozenset[tuple[str, str]]
    found: set[tuple[str, str]] = field(default_factory=set)  # added to from the reader thread too (atomic)


_current: ContextVar[_Attempt | None] = ContextVar("shardflow_split_keys", default=None)


def read_samples(source: BinaryIO | str, url: str = "", *, on_error: str = RAISE, report: ErrorSink | None = None,
                 **options: Any) -> Iterator[Sample]:
    """shards.samples.read_samples inside a task: split keys are noted, and those the task runs
    without are left out (reported once per shard); outside a task attempt, the reader as it is."""
    state = _current.get()
    if state is None or on_error == RAISE:
        return _read_samples(source, url, on_error=on_error, report=report, **options)

    def watch(error: ShardflowError) -> None:
        if isinstance(error, SampleError) and error.key is not None and _REAPPEARS in error.reason:
            state.found.add((url, error.key))
        if report is not None:
            report(error)

    samples = _read_samples(source, url, on_error=on_error, report=watch, **options)
    excluded = {key for shard, key in state.excluded if shard == url}
    return _without(samples, excluded, url, report) if excluded else samples


def _without(samples: Iterator[Sample], keys: set[str], url: str, report: ErrorSink | None) -> Iterator[Sample]:
    told: set[str] = set()
    for sample in samples:
        key = sample["__key__"]
        if key not in keys:
            yield sample
        elif key not in told:
            told.add(key)
            if report is not None:
                report(SampleError("sample left out: its key is split in the shard (its members are not adjacent), "
                                   "so the task ran again without it", url=url, key=key))


def check_split_keys(outputs: list[Any]) -> None:
    """After the attempt wrote its samples, before its done marker: rerun it when it met split keys.
    `outputs`: the ShardInfo receipts of the shards it published (removed before the rerun)."""
    state = _current.get()
    if state is None:
        return
    new = state.found - state.excluded
    if new:
        raise SplitKeysFound(frozenset(new), [info.url for info in outputs])


def without_split_keys(attempt: Callable[[], T], storage_options: dict[str, Any] | None = None,
                       on_rerun: Callable[[], None] | None = None) -> T:
    """Run `attempt` (one try at a task) until it meets no split key it did not leave out: each
    rerun leaves out every split key met so far (the reader reports all of a shard's in one pass,
    so one rerun is the rule). `on_rerun`: take back the progress the discarded attempt reported."""
    excluded: frozenset[tuple[str, str]] = frozenset()
    while True:
        token = _current.set(_Attempt(excluded))
        try:
            return attempt()
        except SplitKeysFound as again:
            excluded |= again.keys
            _remove(again.outputs, storage_options)  # the rerun may write fewer shards: no stale one is left
            if on_rerun is not None:
                on_rerun()
        finally:
            _current.reset(token)


def _remove(urls: list[str], storage_options: dict[str, Any] | None) -> None:
    for url in urls:
        fs, path = filesystem(url, storage_options)
        if fs.exists(path):
            fs.rm(path)
