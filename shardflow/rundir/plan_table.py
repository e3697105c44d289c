"""The task table of a plan, compact: numbered names as ranges, explicit lists only where needed.

A plan of N tasks from `in-{000000..999999}.tar` -> `out/{name}.tar` is three columns (the inputs in
order, the outputs, the rollover patterns), each a few runs such as
`{"p": "s3://b/in-", "a": 0, "w": 6, "n": 1000000, "s": ".tar"}` (prefix, first number, zero-padded
width, count, suffix): a few hundred bytes instead of ~220 bytes per task, and a pod rebuilds only the
tasks of its chunk from it. Names that follow no numbering are kept as explicit lists (`{"l": [...]}`).
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Iterable, Iterator, Sequence

from shardflow.rundir.tasks import Task

_NUMBER = re.compile(r"\d+")


def _next_in_run(previous: str, current: str) -> tuple[str, int, int, str] | None:
    """(prefix, number, width, suffix) of `previous` when `current` is it with one number plus one."""
    if len(previous) > len(current) + 1 or len(current) > len(previous) + 1:
        return None
    for match in _NUMBER.finditer(previous):
        head, tail = previous[: match.start()], previous[match.end():]
        if current.startswith(head) and current.endswith(tail):
            middle = current[len(head) : len(current) - len(tail)]
            value, width = int(match.group()), len(match.group())
            if middle.isdigit() and middle == _format(value + 1, width):
                return head, value, width, tail
    return None


def _format(value: int, width: int) -> str:
    return f"{value:0{width}d}"


def compress(names: Iterable[str]) -> list[dict[str, Any]]:
    """Runs that expand back to `names` exactly (see Column); `names` may be a generator."""
    builder = RunBuilder()
    for name in names:
        builder.add(name)
    return builder.finish()


class RunBuilder:
    """Compresses names one at a time (greedy: a run is extended while the next name continues it)."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.pending: str | None = None
        self.run: list[Any] | None = None  # [head, start, width, tail, count]

    def add(self, name: str) -> None:
        run = self.run
        if run is not None:
            if name == f"{run[0]}{_format(run[1] + run[4], run[2])}{run[3]}":
                run[4] += 1
                return
            self._close_run()
        if self.pending is None:
            self.pending = name
            return
        found = _next_in_run(self.pending, name)
        if found is None:
            self._literal(self.pending)
            self.pending = name
        else:
            self.run, self.pending = [*found, 2], None

    def _close_run(self) -> None:
        head, start, width, tail, count = self.run  # type: ignore[misc]
        self.runs.append({"p": head, "a": start, "w": width, "n": count, "s": tail})
        self.run = None

    def _literal(self, name: str) -> None:
        if self.runs and "l" in self.runs[-1]:
            self.runs[-1]["l"].append(name)
        else:
            self.runs.append({"l": [name]})

    def finish(self) -> list[dict[str, Any]]:
        if self.run is not None:
            self._close_run()
        if self.pending is not None:
            self._literal(self.pending)
            self.pending = None
        return self.runs


def as_task(task: Task | dict[str, Any]) -> Task:
    return task if isinstance(task, Task) else Task.from_json(task)


def as_json(task: Task | dict[str, Any]) -> dict[str, Any]:
    return task.to_json() if isinstance(task, Task) else task


class Column:
    """Random access to the names a list of runs stands for."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.runs = runs
        self.starts: list[int] = []
        total = 0
        for run in runs:
            self.starts.append(total)
            total += len(run["l"]) if "l" in run else int(run["n"])
        self.length = total

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < self.length:
            raise IndexError(index)
        k = bisect.bisect_right(self.starts, index) - 1
        run, offset = self.runs[k], index - self.starts[k]
        if "l" in run:
            return run["l"][offset]
        return f"{run['p']}{_format(int(run['a']) + offset, int(run['w']))}{run['s']}"


class TaskTable:
    """The tasks of a plan as three compressed columns; `task(i)` rebuilds one Task."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.count = int(data["count"])
        self.per_task = int(data["inputs_per_task"])
        self.inputs = Column(data["inputs"])
        self.outputs = Column(data["outputs"])
        self.parts = Column(data["output_parts"])

    @staticmethod
    def encode(tasks: Sequence[Task | dict[str, Any]]) -> dict[str, Any]:
        """The table of tasks (Task, or its JSON), or ValueError when they are not numbered 0..N-1 with
        equal input groups (the last may be shorter), which is how every plan makes them."""
        rows = [as_task(t) for t in tasks]
        per = len(rows[0].inputs) if rows else 1
        for i, t in enumerate(rows):
            if t.id != i or (len(t.inputs) != per and i != len(rows) - 1) or not t.inputs:
                raise ValueError("tasks not in plan order")
        return {
            "count": len(rows), "inputs_per_task": per,
            "inputs": compress([u for t in rows for u in t.inputs]),
            "outputs": compress([t.output for t in rows]),
            "output_parts": compress([t.output_parts for t in rows]),
        }

    def task(self, task_id: int) -> Task:
        if not 0 <= task_id < self.count:
            raise IndexError(task_id)
        first = task_id * self.per_task
        inputs = tuple(self.inputs[i] for i in range(first, min(first + self.per_task, len(self.inputs))))
        return Task(task_id, inputs, self.outputs[task_id], self.parts[task_id])

    def tasks(self, ids: Iterable[int]) -> Iterator[Task]:
        return (self.task(i) for i in ids)
