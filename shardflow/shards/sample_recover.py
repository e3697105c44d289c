"""What sample grouping does next to archive damage: deliver a neighbour of the damage only when it
is provably whole, never a partial sample as if it were good.

A sample next to damage (a Corruption from `iter_members(..., resync=True)`) is whole when the
damaged member's name (the Corruption's hint) names another sample, or, when the shard's samples so
far all had the same set of extensions, it has exactly that set. Otherwise it is left out and
reported. The sample in progress when damage is found stays "pending" until the next member tells
whether it goes on after the damage (then it was cut: left out) or a new sample starts.
"""

from __future__ import annotations

from typing import Callable

from shardflow.errors import SampleError, ShardflowError
from shardflow.shards.keys import Sample, split_name
from shardflow.shards.tar_recover import Corruption

Hints = list[str | None]  # names of damaged members (None: a member that cannot be named)


class DamageGuard:
    """The damage state of one shard being grouped into samples, and the decisions it leads to.

    iter_samples tells it about every sample boundary and every damaged region; it reports (through
    `problem`, which is called from this class's methods) the damage and each sample it leaves out.
    """

    def __init__(self, url: str, problem: Callable[[ShardflowError], None]) -> None:
        self._url = url
        self._problem = problem
        self.pending: Sample | None = None  # the sample in progress when damage was found, undecided
        self._pending_hints: Hints = []  # damage after the pending sample
        self._current_hints: Hints = []  # damage just before the sample in progress
        self._next_hints: Hints = []  # damage the next new sample follows
        self._common: frozenset[str] | None = None  # extension set shared by every clean sample so far
        self._uniform = True  # every clean sample so far had that set

    def damaged(self, damage: Corruption, current: Sample | None) -> None:
        """Report damage found after `current`, the sample in progress, which becomes pending."""
        self._problem(damage.error)
        if current is not None:
            # damage on both sides of `current` counts for it
            self._pending_hints = self._current_hints if self._current_hints else []
            self.pending, self._current_hints = current, []
        self._pending_hints.append(damage.hint)
        self._next_hints.append(damage.hint)

    def cut_by_damage(self, key: str) -> bool:
        """Whether a member of `key` continues the pending sample after the damage: then the damage
        is inside that sample, which is reported and forgotten (the caller skips the rest of it)."""
        assert self.pending is not None
        if key != self.pending["__key__"]:
            return False
        self._problem(SampleError("sample left out: archive damaged inside it", url=self._url, key=key))
        self.pending, self._pending_hints, self._next_hints = None, [], []
        return True

    def settle_pending(self) -> Sample | None:
        """The pending sample when a new one starts after the damage: it if whole, else None (reported)."""
        sample, hints = self.pending, self._pending_hints
        self.pending, self._pending_hints = None, []
        assert sample is not None
        return self._settle(sample, hints)

    def start(self) -> None:
        """A new sample starts: the damage seen since the last one lies just before it."""
        self._current_hints, self._next_hints = self._next_hints, []

    def skip_next(self) -> None:
        """The next sample is left out for another reason: the damage before it no longer matters."""
        self._next_hints = []

    def finish(self, sample: Sample) -> Sample | None:
        """The sample in progress is complete: it if known whole, else None (reported)."""
        hints, self._current_hints = self._current_hints, []
        if hints:
            return self._settle(sample, hints)
        if self._common is None:
            self._common = _exts(sample)
        elif self._uniform and _exts(sample) != self._common:
            self._uniform = False
        return sample

    def _settle(self, sample: Sample, hints: Hints) -> Sample | None:
        if self._whole(sample, hints):
            return sample
        self._problem(SampleError("sample left out: next to archive damage, it may be incomplete",
                                  url=self._url, key=sample["__key__"]))
        return None

    def _whole(self, sample: Sample, hints: Hints) -> bool:
        """Is a sample next to damage known to be complete?"""
        keys = {None if h is None else split_name(h)[0] for h in hints}
        if sample["__key__"] in keys:
            return False
        if self._common is not None and self._uniform:
            return _exts(sample) == self._common
        return None not in keys


def _exts(sample: Sample) -> frozenset[str]:
    return frozenset(k for k in sample if not k.startswith("__"))
