"""Per-task counters that merge by addition, so any set of task stats sums to a run's stats."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_NUMBERS = ("samples_in", "samples_out", "dropped", "skipped", "failed", "bytes_in", "bytes_out",
            "shards_in", "shards_out", "seconds")


@dataclass
class Stats:
    """What one task (or a whole run, after merging) did.

    - dropped: the job function returned None (a filter).
    - skipped: the function raised SkipSample; `skip_reasons` counts each reason.
    - failed: the sample could not be read, decoded, processed or encoded; `fail_reasons` counts
      each exception type.
    """

    samples_in: int = 0
    samples_out: int = 0
    dropped: int = 0
    skipped: int = 0
    failed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    shards_in: int = 0
    shards_out: int = 0
    seconds: float = 0.0
    skip_reasons: Counter = field(default_factory=Counter)
    fail_reasons: Counter = field(default_factory=Counter)

    def merge(self, other: "Stats") -> "Stats":
        """Add `other` into self (in place) and return self."""
        for name in _NUMBERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skip_reasons.update(other.skip_reasons)
        self.fail_reasons.update(other.fail_reasons)
        return self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _NUMBERS}
        out["seconds"] = round(self.seconds, 4)
        out["skip_reasons"] = dict(sorted(self.skip_reasons.items()))
        out["fail_reasons"] = dict(sorted(self.fail_reasons.items()))
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Stats":
        stats = cls(**{name: data.get(name, 0) for name in _NUMBERS})
        stats.skip_reasons = Counter(data.get("skip_reasons", {}))
        stats.fail_reasons = Counter(data.get("fail_reasons", {}))
        return stats
