"""Full tracebacks of sample errors: kept for the first few occurrences of each distinct error.

errors/NNNNNN.jsonl names every failed sample with a 12-character digest of its traceback (file,
line, function of each frame; type and reason for an error reported, never raised: trace_digest); the
first TRACES_PER_DIGEST records of each digest in a task also carry `trace`, the formatted traceback,
so `shardflow status` and the run report can show the file and line where the user's code failed
without keeping 100,000 copies of the same text.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from collections import Counter
from typing import Any, Iterable

from shardflow.text import escape

TRACES_PER_DIGEST = 3  # per task and distinct error
MAX_TRACE_CHARS = 6000  # the end of a longer traceback is kept: the failing line is last
SHOWN_TRACES = 3  # distinct tracebacks printed by `status` and the report
# what a reason quotes from the data (a member name, a key: repr'd in either quote) and its numbers (offsets)
_DATA_IN_REASON = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|\d+")


def trace_digest(error: BaseException, reason: str) -> str:
    """The 12-character digest that groups errors: of the traceback's frames (file, line, function), or,
    for an error never raised (a read problem reported, not thrown: no frames), of its type and its
    reason with the data in it (quoted names, numbers) blanked, so that distinct reasons are distinct
    groups (not all the digest of nothing, da39a3ee5e6b) while one reason about many members is one."""
    frames = traceback.extract_tb(error.__traceback__)
    text = ("|".join(f"{f.filename}:{f.lineno}:{f.name}" for f in frames) if frames else
            f"{type(error).__name__}:{_DATA_IN_REASON.sub('_', reason)}")
    return hashlib.sha1(text.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def printable(text: str) -> str:
    """`text` safe to print on a terminal, line by line (text.escape: ESC, CR, surrogates as escapes).

    Tracebacks carry data (keys, URLs, the user's exception message); a key holding an escape
    sequence must not drive the terminal. The traceback's own newlines stay.
    """
    return "\n".join(escape(line) for line in text.split("\n"))


def format_trace(error: BaseException) -> str:
    """The traceback of `error` as Python prints it (chained causes included), at most MAX_TRACE_CHARS."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    if len(text) > MAX_TRACE_CHARS:
        text = "...\n" + text[-MAX_TRACE_CHARS:].split("\n", 1)[-1]
    return text


class TraceCollector:
    """Counts error records by digest and keeps the first full traceback seen for each."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.first: dict[str, dict[str, Any]] = {}

    def add(self, record: dict[str, Any]) -> None:
        digest = record.get("traceback")
        if not digest:
            return
        self.counts[digest] += 1
        if digest not in self.first and record.get("trace"):
            self.first[digest] = record

    def add_all(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.add(record)

    def distinct(self, limit: int = SHOWN_TRACES) -> list[dict[str, Any]]:
        """The first record (with its trace) of the `limit` most frequent distinct errors."""
        ranked = [d for d, _ in self.counts.most_common() if d in self.first]
        return [{**self.first[d], "count": self.counts[d]} for d in ranked[:limit]]


def describe_traces(records: list[dict[str, Any]], *, total: int | None = None) -> list[str]:
    """Lines for a report: a header per distinct error (count, first key), then its traceback indented."""
    lines: list[str] = []
    for record in records:
        lines.append(f"traceback {record.get('traceback')} ({record.get('count', 1)}x, first: task "
                     f"{record.get('task')} shard {record.get('shard')} key {record.get('key')!r} "
                     f"[{record.get('stage')}]):")
        lines.extend("    " + line for line in str(record.get("trace", "")).splitlines())
    if total is not None and total > len(records):
        lines.append(f"... {total - len(records)} more distinct errors (see errors/*.jsonl, field `trace`)")
    return [printable(line) for line in lines]
