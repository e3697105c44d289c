"""How a plan is stored in the run directory, so that a pod reads O(its tasks) bytes of it.

Version 2 (this release): `plan.json` holds the job description, the settings, the fingerprint, the
task count and, when the names follow a numbering (brace ranges, `{name}`/`{task}` patterns), the
compact task table (rundir.plan_table: a few hundred bytes at any N). When they do not (a glob of
arbitrary names), the table would be as big as the task list, so the tasks go to
`plan/chunk-000123.json` files of PLAN_CHUNK tasks each instead, written before plan.json. Version 1
(0.1.0) kept every task in plan.json; it is still read.

A plan.json that cannot be read (torn, not JSON) is an error naming it (rundir.state_files) that says to
plan again with --redo; `plan_from_markers` is what --redo then knows of the unreadable plan.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Iterator

from shardflow.rundir.layout import DONE, PLAN, RunFiles
from shardflow.rundir.plan_table import TaskTable, as_json
from shardflow.rundir.state_files import loads_or_none
from shardflow.rundir.tasks import Task
from shardflow.storage.options import redact_urls_deep

PLAN_VERSION = 2
PLAN_CHUNK = 1_000  # tasks per plan/chunk-NNNNNN.json
COMPACT_LIMIT = 64 * 1024  # bytes of table kept in plan.json; beyond that, chunk files


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def plan_fingerprint(tasks: Iterable[Task | dict[str, Any]], settings: dict[str, Any] | None = None) -> str:
    """Stable digest of the task list (and of the job settings that shape the outputs, when given):
    a rerun into the same run dir must plan the same tasks with the same settings.

    The digest of `json.dumps({"settings": ..., "tasks": [...]}, sort_keys=True)` (as 0.1.0 wrote it),
    hashed task by task so that a million tasks never make one 200 MB string."""
    digest = hashlib.sha256()
    # as written down: no URL password, not even hashed (redact_urls_deep leaves other strings as they are)
    digest.update(b"[" if settings is None else f'{{"settings":{_dumps(redact_urls_deep(settings))},"tasks":['.encode())
    for i, task in enumerate(tasks):
        text = _dumps(as_json(task))
        if "@" in text:  # only a URL with userinfo changes when redacted
            text = _dumps(redact_urls_deep(as_json(task)))
        digest.update(((',' if i else '') + text).encode())
    digest.update(b"]" if settings is None else b"]}")
    return digest.hexdigest()


def same_table(stored: dict[str, Any] | None, table: dict[str, Any] | None, settings: dict[str, Any]) -> bool:
    """Whether a stored plan holds exactly this task table and these settings (as written down): then its
    fingerprint is this plan's, and a no-op resume of a million-task table need not hash every task."""
    if stored is None or table is None or stored.get("table") is None:
        return False
    written = json.loads(json.dumps(redact_urls_deep({"table": table, "settings": settings})))
    return stored["table"] == written["table"] and stored.get("settings") == written["settings"]


def plan_tasks(plan: dict[str, Any]) -> Iterable[Task | dict[str, Any]]:
    """The tasks of a plan about to be stored: its "tasks", or made one at a time from its "table"."""
    if "tasks" in plan:
        return plan["tasks"]
    table = TaskTable(plan["table"])
    return table.tasks(range(table.count))


def chunk_name(chunk: int) -> str:
    return f"plan/chunk-{chunk:06d}.json"


def store_plan(run_dir: RunFiles, plan: dict[str, Any], fingerprint: str, *, unchanged: int = 0) -> None:
    """Write `plan` (its "tasks": Task objects or their JSON, or its "table": job.lazy_plan) in the version-2
    layout: chunk files first, plan.json last. Tasks become JSON one at a time, never all at once.

    `unchanged`: the first tasks are already stored in chunk files of this layout (a plan grown by
    --extend, job.extend): their full chunk files are not written again, only the last partial one and
    the new ones. Until plan.json is replaced, the old plan reads the same tasks from them (a chunk file
    only grows at its end), so a kill between the writes leaves the old plan or the new one."""
    table: dict[str, Any] | None = plan.get("table")
    tasks = plan["tasks"] if table is None else []
    stored = {k: v for k, v in plan.items() if k not in ("tasks", "table")}
    stored.update(version=PLAN_VERSION, fingerprint=fingerprint, plan_chunk=PLAN_CHUNK,
                  task_count=len(tasks) if table is None else int(table["count"]))
    if table is None:
        try:
            table = TaskTable.encode(tasks)
        except ValueError:
            table = None
    if table is not None and len(_dumps(table)) > COMPACT_LIMIT:
        tasks = tasks or list(plan_tasks(plan))  # a table from the specs, too big to keep: chunk files
        table = None
    if table is None:
        for start in range(unchanged - unchanged % PLAN_CHUNK, len(tasks), PLAN_CHUNK):
            chunk = [redact_urls_deep(as_json(t)) for t in tasks[start : start + PLAN_CHUNK]]  # no URL passwords
            run_dir.write_bytes(chunk_name(start // PLAN_CHUNK), _dumps(chunk).encode())
    stored["table"] = table
    run_dir.write_json(PLAN, stored)


def chunked(plan: dict[str, Any]) -> bool:
    """Whether a stored plan keeps its tasks in chunk files of this release's size (what store_plan's
    `unchanged` may skip)."""
    return "task_count" in plan and plan.get("table") is None and int(plan.get("plan_chunk", 0)) == PLAN_CHUNK


def carried(plan: dict[str, Any]) -> dict[str, Any]:
    """A stored plan's own keys (job, settings, code, overwrite, ...) without the ones store_plan writes
    (version, fingerprint, task count, table): what a grown plan keeps of the stored one."""
    return {k: v for k, v in plan.items()
            if k not in ("version", "fingerprint", "plan_chunk", "task_count", "table", "tasks")}


def task_count(plan: dict[str, Any]) -> int:
    """How many tasks a stored plan has (any version)."""
    return int(plan["task_count"]) if "task_count" in plan else len(plan.get("tasks", []))


def load_tasks(run_dir: RunFiles, plan: dict[str, Any], ids: Iterable[int]) -> Iterator[Task]:
    """The tasks `ids` of a stored plan, reading only what they need (any version)."""
    if "task_count" not in plan:  # version 1: every task in plan.json
        tasks = plan.get("tasks", [])
        return (Task.from_json(tasks[i]) for i in ids)
    if plan.get("table") is not None:
        return TaskTable(plan["table"]).tasks(ids)
    return _from_chunks(run_dir, plan, ids)


def _from_chunks(run_dir: RunFiles, plan: dict[str, Any], ids: Iterable[int]) -> Iterator[Task]:
    per = int(plan.get("plan_chunk", PLAN_CHUNK))
    loaded: dict[int, list[dict[str, Any]]] = {}
    for task_id in ids:
        chunk = task_id // per
        if chunk not in loaded:
            loaded.clear()  # ids come in order: one chunk file in memory at a time
            loaded[chunk] = run_dir.read_json(chunk_name(chunk))
        yield Task.from_json(loaded[chunk][task_id - chunk * per])


def task_jsons(run_dir: RunFiles, plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every task of a stored plan as JSON, in order (for the refusal message of a different plan)."""
    return (t.to_json() for t in load_tasks(run_dir, plan, range(task_count(plan))))


def check_readable(run_dir: RunFiles, plan: dict[str, Any]) -> None:
    """Read every chunk file of a stored plan (none for a table or version 1): RunStateError naming the
    first unreadable one. What --redo checks before it trusts a stored plan that equals the new one."""
    if "task_count" in plan and plan.get("table") is None:
        per = int(plan.get("plan_chunk", PLAN_CHUNK))
        for chunk in range(-(-task_count(plan) // per)):
            run_dir.read_json(chunk_name(chunk))


def plan_from_markers(run_dir: RunFiles) -> dict[str, Any]:
    """What --redo knows of an unreadable plan.json: a version-1 plan with a task per shard the run
    directory's done markers say it wrote, so the outputs check (job.guard) takes those shards for its
    own and the redo replaces them instead of refusing them as another dataset's. Its fingerprint matches
    no plan, so init_plan(force=True) resets the run directory and stores the new plan. A marker that is
    unreadable too vouches for nothing (its shards are then refused unless --overwrite)."""
    names = [f"{DONE}/{n}" for n in run_dir.list_names(DONE) if n.endswith(".json")]
    tasks: list[dict[str, Any]] = []
    for text in run_dir.read_many(names, parse=False):
        marker = loads_or_none(text)
        outputs = marker.get("outputs") if isinstance(marker, dict) else None
        for out in outputs if isinstance(outputs, list) else []:
            url = out.get("url") if isinstance(out, dict) else None
            if isinstance(url, str):  # its own name as the part pattern: that name and no other
                tasks.append({"id": len(tasks), "inputs": [], "output": url,
                              "output_parts": url.replace("{", "{{").replace("}", "}}")})
    return {"tasks": tasks, "fingerprint": None}
