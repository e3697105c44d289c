"""Task and TaskResult: the small, picklable values that cross process and cluster boundaries.

A Task says what to do (its id, input URLs, output naming); a TaskResult says what happened. Both
convert to and from JSON, the form they take in plan.json, in markers and in Dask events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardflow.errors import RAISE, FailureKind
from shardflow.rundir.stats import Stats

# Failure kinds, by their 0.1.0 names (TaskResult.kind holds these values; see errors.FailureKind).
INPUT = FailureKind.INPUT
IO = FailureKind.IO
USER = FailureKind.USER


@dataclass(frozen=True)
class Task:
    """A unit of work: a few input shards, and where its output parts go.

    `output` is the URL of part 0; `output_parts` is a format string with a `{part}` field for the
    parts a task rolls over into (maxcount/maxsize).
    """

    id: int
    inputs: tuple[str, ...]
    output: str
    output_parts: str

    def part_url(self, part: int) -> str:
        return self.output if part == 0 else self.output_parts.format(part=part)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "inputs": list(self.inputs), "output": self.output, "output_parts": self.output_parts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Task":
        return cls(int(data["id"]), tuple(data["inputs"]), data["output"], data["output_parts"])


@dataclass
class TaskResult:
    """What happened to one task; small and picklable so it crosses process/cluster boundaries."""

    task_id: int
    status: str  # "done" | "skipped" (finished by an earlier run) | "failed"
    stats: Stats = field(default_factory=Stats)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    kind: str | None = None  # failure kind: a FailureKind value
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def stops_run(self, on_error: str) -> bool:
        """Whether this result ends the whole run: any failure under on_error="raise", and a `user`
        failure always (the job cannot work there, so every other task would fail the same way)."""
        return self.status == "failed" and (on_error == RAISE or self.kind == USER)

    @classmethod
    def failed(cls, task_id: int, error: str, kind: str, attempts: int = 1) -> "TaskResult":
        return cls(task_id, "failed", error=error, kind=kind, attempts=attempts)

    @classmethod
    def from_marker(cls, task_id: int, record: dict[str, Any], status: str = "done") -> "TaskResult":
        """The result a task's done marker holds (run_task writes its stats and outputs there)."""
        return cls(task_id, status, Stats.from_json(record["stats"]), record["outputs"])

    def to_json(self) -> dict[str, Any]:
        """msgpack/JSON-safe data (the inverse of from_json)."""
        return {"task_id": self.task_id, "status": self.status, "stats": self.stats.to_json(),
                "outputs": self.outputs, "error": self.error,
                "kind": None if self.kind is None else str(self.kind), "attempts": self.attempts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TaskResult":
        return cls(int(data["task_id"]), data["status"], Stats.from_json(data["stats"]), list(data["outputs"]),
                   data.get("error"), data.get("kind"), int(data.get("attempts", 1)))
