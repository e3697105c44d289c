"""The error policy of run_task, in one place: count, log and judge the samples a task loses.

`on_error="raise"` stops the task at the first bad sample; otherwise each one is logged (shard, key,
stage, reason) for errors/NNNNNN.jsonl, and the task fails only when too many samples failed
(`max_failure_rate`), naming the most common failure with an example key.
"""

from __future__ import annotations

import hashlib
import sys
import traceback
from typing import Any

from shardflow.errors import RAISE, WARN, FailureKind, ShardflowError
from shardflow.run.stats import Stats
from shardflow.text import redact_userinfo, safe, safe_repr, truncate


class TaskFailed(Exception):
    """Ends a task's attempt with a recorded failure of `kind` (not retried as I/O trouble is)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class SampleFailures:
    """The lost samples of one task: counted in `stats`, listed in `errors`, judged by the policy."""

    def __init__(self, task_id: int, stats: Stats, on_error: str, max_failure_rate: float) -> None:
        self.task_id = task_id
        self.stats = stats
        self.on_error = on_error
        self.max_failure_rate = max_failure_rate
        self.errors: list[dict[str, Any]] = []

    def record(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Log a failed sample; raise instead when the policy says to stop."""
        self.stats.failed += 1
        self.stats.fail_reasons[type(error).__name__] += 1
        self.note(error, url, key, where)
        if self.on_error == RAISE:
            kind = FailureKind.INPUT if isinstance(error, ShardflowError) else FailureKind.USER
            reason = self.errors[-1]["reason"]
            raise TaskFailed(f"shard {safe(redact_userinfo(url))}, key {safe_repr(key)}, {where}: {safe(reason, 2000)}",
                             kind) from error
        if self.on_error == WARN:
            reason = self.errors[-1]["reason"]
            print(f"shardflow: skipped shard {safe(redact_userinfo(url))}, key {safe_repr(key)} ({where}): "
                  f"{safe(reason, 2000)}", file=sys.stderr)
        self.check_rate()

    def note(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Add a line to the task's error log (errors/<task>.jsonl), without counting a failed sample."""
        reason = error.reason if isinstance(error, ShardflowError) else f"{type(error).__name__}: {error}"
        frames = traceback.extract_tb(error.__traceback__)
        digest = hashlib.sha1("|".join(f"{f.filename}:{f.lineno}:{f.name}" for f in frames).encode()).hexdigest()[:12]
        self.errors.append({
            # the key and reason may hold a 5 MB name: cut (text.truncate); JSON escapes the rest
            "task": self.task_id, "shard": redact_userinfo(url), "key": None if key is None else truncate(key),
            "stage": where, "type": type(error).__name__, "reason": truncate(redact_userinfo(reason), 2000),
            "traceback": digest,
        })

    def check_rate(self, final: bool = False) -> None:
        """Fail the task when too many samples failed: while streaming once 10 have failed and they are
        more than max_failure_rate of those read so far; at the end, over the whole task."""
        stats, rate = self.stats, self.max_failure_rate
        least = min(10, stats.samples_in) if final else 10
        if stats.failed and stats.failed >= least and stats.failed > rate * stats.samples_in:
            raise TaskFailed(
                f"{stats.failed} of {stats.samples_in} samples failed (more than max_failure_rate={rate}); "
                f"{self.most_common_error()}; every one is listed in errors/ in the run directory",
                FailureKind.INPUT,
            )

    def most_common_error(self) -> str:
        """'most often at decode: DecodeError (12x), e.g. key 'a/17': ...' for failure messages."""
        counts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for error in self.errors:
            counts.setdefault((error["stage"], error["type"]), []).append(error)
        if not counts:
            return "no sample errors recorded"
        (stage, kind), errors = max(counts.items(), key=lambda item: len(item[1]))
        first = errors[0]
        return (f"most often at {stage}: {kind} ({len(errors)}x), e.g. key {safe_repr(first['key'])}: "
                f"{safe(first['reason'], 2000)}")
