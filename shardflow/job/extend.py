"""--extend (`job.run(extend=True)`): new input shards become new tasks of the plan a run directory holds.

A dataset that grows (new shards land every day) is rerun with the same command plus --extend. The
stored plan's tasks are kept exactly (ids, inputs, outputs); the inputs that are no stored task's become
new tasks numbered after them, grouped among themselves (`inputs_per_task`) and named by the same
outputs (a `{task:06d}` pattern continues where the stored plan stopped); the grown plan replaces the
stored one (new chunk files first, plan.json last: a kill in between leaves the old plan, whole). Done
tasks stay done (their markers and summaries name ids that keep their meaning); the driver runs the new
tasks and any unfinished old ones. It only adds: an input of the stored plan that is gone from the
listing is refused, and so are other settings (--redo starts over) and other code (--resume-anyway).
Inputs that are the stored plan's own outputs (a glob over the output folder) are never new inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from shardflow.errors import JobError
from shardflow.job import guard
from shardflow.job.naming import check_parts_apart, is_pattern, output_names, pattern_name
from shardflow.rundir.plan_store import carried, chunked, plan_fingerprint, plan_tasks, store_plan, task_count
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.storage.options import redact_urls, redact_urls_deep

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


@dataclass(frozen=True)
class Extension:
    """What --extend did: `kept` stored tasks, `added` new ones after them (small: it stays on the job,
    which is pickled to every worker)."""

    kept: int
    added: int

    def line(self) -> str:
        """One line for the person who ran it."""
        if not self.added:
            return f"--extend: no new inputs; resuming the stored plan of {self.kept} tasks"
        ids = f"task {self.kept}" if self.added == 1 else f"tasks {self.kept}..{self.kept + self.added - 1}"
        noun = "task" if self.added == 1 else "tasks"
        return f"--extend: {self.added} new {noun} ({ids}) after the {self.kept} stored"


class Grown(NamedTuple):
    """extend_stored's answer: what it did; plan.json now and its fingerprint; the grown plan's tasks (None
    for a table, or a plan left as it was: ShardJob.plan() makes the same)."""

    extension: Extension
    stored: dict[str, Any]
    fingerprint: str
    tasks: list[Task] | None


def extend_stored(job: "ShardJob", run_dir: RunDir, stored: dict[str, Any], table: dict[str, Any] | None,
                  settings: dict[str, Any], fingerprint: str, *, resume_anyway: bool = False,
                  overwrite: bool = False) -> Grown:
    """Grow the plan `stored` in `run_dir` by the job's new inputs and store it (see the module doc).

    `table`: the job's plan as a table (job.lazy_plan) when its specs give one: a brace range that now
    reaches further continues the stored table without a Task made per task. `fingerprint`: the job's
    plan's as the specs make it; the stored one's: nothing new (a plain resume)."""
    kept = task_count(stored)
    if stored.get("fingerprint") == fingerprint:
        return Grown(Extension(kept, 0), stored, fingerprint, None)
    _check_settings(run_dir, stored, settings)
    planned: dict[str, Any]
    if table is not None and stored.get("table") is not None and _table_continues(stored["table"], table):
        added, tasks = int(table["count"]) - kept, None
        if added:
            guard.check_table(job, table, run_dir, overwrite=overwrite, stored=stored)
        planned = {"table": table}
    else:
        old, new = _grown_tasks(job, run_dir, stored, kept)
        added, tasks = len(new), old + new
        if added:
            _check_apart(job, tasks)
            guard.check_not_in_place(tasks, job.spec.inputs)
            if not overwrite:
                guard.check_foreign_shards(job, new, run_dir, stored=stored)
        planned = {"tasks": tasks}
    if not added:  # the stored plan, as it is (a plan grouped otherwise than the specs would now group it)
        return Grown(Extension(kept, 0), stored, stored["fingerprint"], tasks)
    fingerprint = plan_fingerprint(plan_tasks(planned), settings)
    guard.check_code(job, run_dir, resume_anyway=resume_anyway)  # other code: refused before anything is written
    plan = {**carried(stored), "job": job.describe(), **planned, "settings": settings,
            "code": guard.code_fingerprint(job)}
    store_plan(run_dir, plan, fingerprint, unchanged=kept if chunked(stored) else 0)
    grown = run_dir.stored_plan()
    assert grown is not None
    return Grown(Extension(kept, added), grown, fingerprint, tasks)


def _written(value: Any) -> Any:
    """`value` as the run directory writes it down (URL passwords redacted, JSON types)."""
    return json.loads(json.dumps(redact_urls_deep(value), sort_keys=True))


def _check_settings(run_dir: RunDir, stored: dict[str, Any], settings: dict[str, Any]) -> None:
    old, new = stored.get("settings") or {}, _written(settings)
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        raise JobError(f"--extend adds inputs to the job that planned run directory {run_dir.url}, but its "
                       f"settings differ ({', '.join(changed[:5])}): rerun with the same settings, or pass --redo "
                       "(redo=True) instead to start over")


def _runs_continue(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    """Whether the names a table column's runs `old` stand for are the first ones `new` stands for."""
    if not old or len(old) > len(new) or old[:-1] != new[: len(old) - 1]:
        return False
    last, other = old[-1], new[len(old) - 1]
    if "l" in last:
        return "l" in other and other["l"][: len(last["l"])] == last["l"]
    return "n" in other and all(other[k] == last[k] for k in "paws") and int(other["n"]) >= int(last["n"])


def _table_continues(old: dict[str, Any], table: dict[str, Any]) -> bool:
    """Whether the table `table` is the stored table `old` with tasks after its last (its groups whole, so
    the new inputs are grouped among themselves)."""
    new = _written(table)
    per = int(old["inputs_per_task"])
    inputs = sum(len(r["l"]) if "l" in r else int(r["n"]) for r in old["inputs"])
    return (int(new["inputs_per_task"]) == per and inputs == int(old["count"]) * per
            and all(_runs_continue(old[c], new[c]) for c in ("inputs", "outputs", "output_parts")))


def _grown_tasks(job: "ShardJob", run_dir: RunDir, stored: dict[str, Any], kept: int) -> tuple[list[Task], list[Task]]:
    """(the stored tasks, with the listing's own spelling of their inputs; the new tasks after them)."""
    old = list(run_dir.load_tasks(stored, range(kept)))
    listing = [url for task in job.plan() for url in task.inputs]  # the job's inputs, listed once
    spelled = {redact_urls(u): u for u in listing}  # stored plans hold no URL password or secret query value
    stored_inputs = [u for t in old for u in t.inputs]
    gone = [u for u in stored_inputs if u not in spelled]
    if gone:
        many = len(gone) > 1
        raise JobError(f"--extend only adds inputs: {len(gone)} input{'s' if many else ''} of the plan in run "
                       f"directory {run_dir.url} {'are' if many else 'is'} not among the inputs any more (e.g. "
                       f"{gone[0]}); give {'them' if many else 'it'} again, or pass --redo (redo=True) to plan anew")
    known = set(stored_inputs)
    ours = guard.own_outputs(old)
    new = [u for u in listing if redact_urls(u) not in known and not ours(u)]
    old = [Task(t.id, tuple(spelled[u] for u in t.inputs), t.output, t.output_parts) for t in old]
    per = job.spec.inputs_per_task
    groups = [new[i : i + per] for i in range(0, len(new), per)]
    old, names = _names(job.spec.outputs, old, groups)
    return old, [Task(kept + j, tuple(group), output, parts)
                 for j, (group, (output, parts)) in enumerate(zip(groups, names))]


def _names(outputs: Any, old: list[Task], groups: Sequence[Sequence[str]]) -> tuple[list[Task], list[tuple[str, str]]]:
    """(the stored tasks, their outputs spelled as `outputs` names them where the stored ones were redacted;
    (output, rollover parts) of each new task): a pattern is filled with the new tasks' ids, after the stored
    ones; a spec of one output per task names the stored tasks' outputs first, as stored."""
    if is_pattern(outputs):
        old = [t if "***" not in t.output + t.output_parts else _respelled(t, *pattern_name(outputs, t.id, t.inputs[0]))
               for t in old]
        return old, [pattern_name(outputs, len(old) + j, group[0]) for j, group in enumerate(groups)]
    every = output_names(outputs, [t.inputs for t in old] + list(groups))
    drift = next((t for t, (name, _) in zip(old, every) if redact_urls(name) != t.output), None)
    if drift is not None:
        raise JobError(f"--extend keeps the stored tasks' outputs, but the outputs given name another shard for "
                       f"task {drift.id} (stored: {drift.output}): list the stored outputs first, then the new ones")
    return [_respelled(t, *names) for t, names in zip(old, every)], every[len(old):]


def _respelled(task: Task, output: str, parts: str) -> Task:
    """`task` writing to `output` (`parts`) when they are its stored names, unredacted; else as stored."""
    if (redact_urls(output), redact_urls(parts)) != (task.output, task.output_parts):
        return task
    return Task(task.id, task.inputs, output, parts)


def _check_apart(job: "ShardJob", tasks: list[Task]) -> None:
    """No two tasks of the grown plan write one name (part 0, or a rollover part of a job that rolls over)."""
    first: dict[str, int] = {}
    for task in tasks:
        other = first.setdefault(task.output, task.id)
        if other != task.id:
            raise JobError(f"new task {task.id} (input {task.inputs[0]}) would write {task.output}, the output of "
                           f"task {other}: name the outputs apart (add {{task}} to the output pattern)")
    if job.spec.maxcount or job.spec.maxsize:
        check_parts_apart([(t.output, t.output_parts) for t in tasks])

