"""A plan's compact task table made straight from its specs, without a Task object per task.

For the common large plan (inputs a brace range such as `s3://b/in-{0000000..0999999}.tar`, outputs a
pattern with `{name}` or `{task}`), `prepare()` needs only the table and the fingerprint: both are
computed here in one pass over the names, in constant memory, instead of building a million Tasks
(`ShardJob.plan()` still builds them when a backend needs the task list). Anything else returns None and
the plan is built as usual.
"""

from __future__ import annotations

from typing import Any, Sequence

import braceexpand

from shardflow.job.naming import is_pattern, pattern_name
from shardflow.rundir.plan_table import RunBuilder
from shardflow.storage.specs import numeric_ranges, spec_parts


def table_from_specs(inputs: str | Sequence[str], outputs: str | Sequence[str], per_task: int) -> dict[str, Any] | None:
    """The TaskTable data of the plan these specs make, or None when they are not a brace range of inputs
    and an output pattern whose names come out as one numbered run (so provably distinct)."""
    if not isinstance(inputs, str) or not is_pattern(outputs):
        return None
    pieces = spec_parts(inputs)  # the spec as expand() reads it: `a::b` joined lists, ${VAR} expanded
    if len(pieces) != 1 or numeric_ranges(pieces[0]) is None:
        return None
    inputs = pieces[0]
    names, outs, parts = RunBuilder(), RunBuilder(), RunBuilder()
    count, first, in_group = 0, "", 0
    for url in braceexpand.braceexpand(inputs):
        names.add(url)
        first = url if in_group == 0 else first
        in_group += 1
        if in_group == per_task:
            _add_task(outputs, count, first, outs, parts)  # type: ignore[arg-type]
            count, in_group = count + 1, 0
    if in_group:
        _add_task(outputs, count, first, outs, parts)  # type: ignore[arg-type]
        count += 1
    out_runs = outs.finish()
    if count == 0 or not (len(out_runs) == 1 and ("n" in out_runs[0] or len(out_runs[0]["l"]) == 1)):
        return None  # no tasks, or names that need plan()'s duplicate check
    return {"count": count, "inputs_per_task": per_task, "inputs": names.finish(), "outputs": out_runs,
            "output_parts": parts.finish()}


def _add_task(pattern: str, task_id: int, first_input: str, outs: RunBuilder, parts: RunBuilder) -> None:
    output, output_parts = pattern_name(pattern, task_id, first_input)
    outs.add(output)
    parts.add(output_parts)
