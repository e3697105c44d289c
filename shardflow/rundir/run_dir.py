"""The run directory: the one place that says what a run is and how far it got.

RunDir reads and writes its files (a local path or any fsspec URL); their names and folders are
rundir/layout.py's. Every file is written atomically (temp + rename locally, a single PUT on object
stores), so a crash never leaves a truncated JSON that breaks resume.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator

from shardflow.errors import JobError, RunStateError, ShardIOError
from shardflow.rundir.layout import (
    LAST_RUN,
    OWN_FOLDERS,
    PLAN,
    RECORDS,
    RUNNING,
    SUMMARIES,
    SUMMARY,
    done_file,
    errors_file,
    failed_file,
)
from shardflow.rundir.listing import (
    TEMP_TAG,
    KnownNames,
    cat_options,
    list_folder,
    list_task_folder,
    read_files,
    remove_own_temps,
)
from shardflow.rundir.plan_store import (  # noqa: F401 - PLAN_VERSION, plan_fingerprint: public names here
    PLAN_VERSION,
    load_tasks,
    plan_fingerprint,
    plan_tasks,
    store_plan,
    task_count,
    task_jsons,
)
from shardflow.rundir.plan_table import as_json
from shardflow.rundir.state_files import loads, unreadable
from shardflow.rundir.summaries import summary_ranges
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.storage.atomic import publish_chunks, write_local_atomic
from shardflow.storage.options import redact_urls_deep
from shardflow.storage.paths import filesystem, is_local
from shardflow.storage.retrying_fs import RetryingFileSystem, run_dir_retry


def _plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two plans, in a few words for the refusal message."""
    old_tasks, new_tasks = old["tasks"], new.get("tasks", [])  # old: its tasks loaded (plan_store.task_jsons)
    if old_tasks != new_tasks:
        if len(old_tasks) != len(new_tasks):
            return f"{len(old_tasks)} tasks there, {len(new_tasks)} now"
        first = next(i for i, (a, b) in enumerate(zip(old_tasks, new_tasks)) if a != b)
        return f"task {first} differs (inputs or output names)"
    old_set, new_set = old.get("settings") or {}, new.get("settings") or {}
    changed = []
    for key in sorted(set(old_set) | set(new_set)):
        a, b = old_set.get(key), new_set.get(key)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                changed.extend(f"{key}.{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                               if a.get(k) != b.get(k))
            else:
                changed.append(f"{key} {a!r} -> {b!r}")
    return "same tasks, other job settings: " + ", ".join(changed[:5]) if changed else "other job settings"


def _inputs(plan: dict[str, Any]) -> set[str]:
    """The input URLs of a plan's loaded tasks (JSON): a plan whose inputs grew can be extended (job.extend)."""
    return {url for task in plan["tasks"] for url in task["inputs"]}


def redacted_json(obj: Any, compact: bool = False) -> str:
    """json.dumps of redact_urls_deep(obj), keys sorted. Redaction changes only strings holding "://",
    which json writes as they are: a text without one needs no redacting (a done marker's ~23 us)."""
    options: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 1}
    try:
        text: str | None = json.dumps(obj, sort_keys=True, **options)
    except TypeError:  # a Mapping that is not a dict: redact_urls_deep makes it one
        text = None
    if text is None or "://" in text:
        text = json.dumps(redact_urls_deep(obj), sort_keys=True, **options)
    return text


class RunDir:
    """Reads and writes the files of one run directory."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 retry_budget: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = storage_options
        self.fs, self.path = filesystem(self.url, storage_options)
        self._local = is_local(self.url)
        if not self._local:  # retried per outage, up to the retry budget; "lost the store, rerun" past it
            self.fs = RetryingFileSystem(self.fs, self.url, run_dir_retry(retry_budget))
        self._known = None if self._local else KnownNames(self.list_names)  # local deletes cost no request

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_known": None}  # what one process knew is not another's: relisted there

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self._local:
            self._known = KnownNames(self.list_names)

    def _path(self, name: str) -> str:
        return f"{self.path}/{name}"

    # -- raw files --------------------------------------------------------------------------
    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a file so that readers see the old content or the new, never a mix."""
        path = self._path(name)
        if self._local:
            write_local_atomic(path, data, tag=TEMP_TAG)
        else:
            self.fs.pipe_file(path, data)  # one PUT: object stores publish it whole or not at all
            if self._known is not None:
                self._known.add(name)

    def write_chunks(self, name: str, chunks: Iterable[bytes]) -> None:
        """write_bytes for a file made piece by piece (summary.json at a million shards), never whole in
        memory: temp + fsync + rename locally, one upload that publishes whole or not at all on object
        stores (storage.atomic.publish_chunks)."""
        path = self._path(name)
        if self._local:
            write_local_atomic(path, chunks, tag=TEMP_TAG)
        else:
            publish_chunks(self.fs, path, chunks)
            if self._known is not None:
                self._known.add(name)

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(self._path(name), **cat_options(self.fs))

    def write_json(self, name: str, obj: Any, *, compact: bool = False) -> None:
        """`obj` as JSON with its URLs redacted; `compact` (done markers: one a task, read by programs)
        skips the indentation, which only json's pure-Python encoder writes (~30 us a marker against ~9)."""
        self.write_bytes(name, redacted_json(obj, compact).encode())

    def read_json(self, name: str) -> Any:
        """The JSON file `name`; RunStateError naming it (and what to do) when it does not parse."""
        return loads(self.read_bytes(name), f"{self.url.rstrip('/')}/{name}")

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._path(name))

    def remove(self, name: str) -> None:
        if self._known is not None:
            self._known.discard(name)
        try:
            if self._local:  # a file of ours: one unlink (fsspec's rm stats and lists first, ~3x the CPU)
                os.unlink(self._path(name))
            else:
                self.fs.rm(self._path(name))
        except FileNotFoundError:
            pass

    def remove_many(self, names: list[str]) -> None:
        """remove() of each name, in order (absent ones are fine); object stores get one bulk delete
        (s3fs: 1,000 keys a request) where the filesystem takes a list, so forgetting 10,000 tasks
        (rundir.retry) is not 10,000 DELETEs one after another."""
        if self._local or len(names) < 2:
            for name in names:
                self.remove(name)
            return
        if self._known is not None:
            for name in names:
                self._known.discard(name)
        try:
            self.fs.rm([self._path(n) for n in names])
        except FileNotFoundError:  # a filesystem whose bulk delete refuses a missing name: one at a time
            for name in names:
                self.remove(name)

    def remove_if_present(self, name: str) -> None:
        """remove(name), with no request when this process's listing of the folder says it is absent."""
        if self._known is None or self._known.may_exist(name):
            self.remove(name)

    def list_names(self, folder: str, *, tasks: int | None = None, prefix: str = "") -> list[str]:
        """Base names in `folder`: one (paginated) listing, empty when it does not exist. With `tasks`
        (a folder of about one name per task: done/, records/), object stores list 1,000 ids a request,
        concurrently. With `prefix`, only the names starting with it (stores listing by key prefix are
        asked for those alone).

        The listing is not kept in the filesystem's cache: s3fs scans a cached listing linearly before
        each later read of a file in it, so N markers read after listing cost O(N^2)."""
        if tasks is not None:
            return list_task_folder(self.fs, self._path(folder), local=self._local, tasks=tasks)
        return list_folder(self.fs, self._path(folder), local=self._local, prefix=prefix)

    def read_many(self, names: list[str], *, parse: bool = True) -> list[Any]:
        """Several files, in order (fetched concurrently on object stores); None for one that is gone."""
        return read_files(self.fs, [self._path(n) for n in names], local=self._local, parse=parse)

    # -- plan ----------------------------------------------------------------------------------
    def stored_plan(self) -> dict[str, Any] | None:
        """plan.json as stored (None when there is none yet): one request."""
        try:
            return self.read_json(PLAN)
        except FileNotFoundError:
            return None

    def init_plan(self, plan: dict[str, Any], *, force: bool = False, fingerprint: str | None = None,
                  stored: Any = ...) -> None:
        """Write the plan once; refuse a different plan unless told to start over (`force`: what `redo`
        passes). plan["tasks"]: Task objects (what prepare() passes: no second copy of a million tasks as
        dicts) or their JSON; or, instead of "tasks", "table": the TaskTable data (job.lazy_plan), from which
        tasks are made one at a time. `fingerprint`, `stored`: already computed / read by the caller."""
        if fingerprint is None:
            fingerprint = plan_fingerprint(plan_tasks(plan), plan.get("settings"))
        old = self.stored_plan() if stored is ... else stored
        if old is not None:
            if old.get("fingerprint") == fingerprint:
                return
            if not force:
                old = {**old, "tasks": list(task_jsons(self, old))}
                plan = {**plan, "tasks": [as_json(t) for t in plan_tasks(plan)]}
                raise JobError(
                    f"run directory {self.url} holds a different plan ({_plan_difference(old, plan)}); "
                    "use another run_dir, " + ("--extend (extend=True) to add the new inputs as new tasks, "
                                               if _inputs(old) < _inputs(plan) else "") +
                    "or --redo (redo=True) to discard its progress and start over"
                )
            self.reset()
        store_plan(self, plan, fingerprint)  # plan.json (+ plan/chunk-*.json when names follow no numbering)

    def task_count(self, plan: dict[str, Any]) -> int:
        """How many tasks the stored `plan` (from load_plan) has."""
        return task_count(plan)

    def load_tasks(self, plan: dict[str, Any], ids: Iterable[int]) -> Iterator[Task]:
        """The tasks `ids` (in order) of the stored `plan`, reading O(len(ids)) bytes of the run directory."""
        return load_tasks(self, plan, ids)

    def remove_stale_temps(self) -> int:
        """Delete the temps a killed writer of this run directory left (local run dirs only: object stores
        get single PUTs). Only shardflow's own exact temp form with the run directory's tag, and only in
        the folders it writes (another program's `.db.tmp-journal` beside them is left alone). Call it
        where one driver owns the run dir (job.prepare), not from workers."""
        return remove_own_temps(self.path, OWN_FOLDERS, TEMP_TAG) if self._local else 0

    def reset(self) -> None:
        """Forget all progress and the stored plan's chunk files (a new plan is about to be stored)."""
        self.forget_progress()
        for name in self.list_names("plan"):
            self.remove(f"plan/{name}")

    def forget_progress(self) -> None:
        """Forget all progress (markers, failures, error logs, summaries) and keep the plan: what a redo
        of the stored plan does (its chunk files, plan/chunk-*.json, are part of the plan, not progress).

        What says "done" goes before the markers: `done_ids` trusts per-chunk summaries that cover the
        plan (and status reads records), so a redo killed after the markers but before the summaries left
        a run that read as complete while no task of it had run again."""
        self.remove(SUMMARY)
        self.remove(LAST_RUN)
        for folder in (SUMMARIES, RECORDS, RUNNING, "done", "failed", "errors"):
            self.remove_many([f"{folder}/{name}" for name in self.list_names(folder)])

    def load_plan(self) -> dict[str, Any]:
        try:
            plan = self.read_json(PLAN)
        except FileNotFoundError as exc:
            raise JobError(f"no plan.json in run directory {self.url}: plan or run the job first") from exc
        except NotADirectoryError:  # permanent (a worker stops with 78, not retried as unreachable)
            raise RunStateError(f"{self.url} is a file, not a run directory") from None
        # JSON that is not a plan (a list, `{}`) is as unreadable as torn JSON: one line naming the file
        if not isinstance(plan, dict) or not (isinstance(plan.get("task_count"), int)
                                              or isinstance(plan.get("tasks"), list)):
            raise unreadable(f"{self.url.rstrip('/')}/{PLAN}",
                             ValueError("not a plan: a JSON object with task_count or tasks"))
        return plan

    # -- task state ----------------------------------------------------------------------------
    def done_ids(self, tasks: int | None = None) -> set[int]:
        """Ids of the done tasks. When the per-chunk summaries cover the whole plan, their names say it
        (one short listing, no listing of done/: at 100k tasks on S3 that is 100 pages of XML to parse);
        otherwise one listing of done/."""
        covered = summary_ranges(self.list_names(SUMMARIES))
        if covered and tasks is None and self.exists(PLAN):
            tasks = task_count(self.read_json(PLAN))
        if covered and tasks is not None:
            if sum(stop - first for first, stop in covered if stop <= tasks) == tasks:
                return set(range(tasks))
        return {int(n.split(".")[0]) for n in self.list_names("done", tasks=tasks) if n.endswith(".json")}

    def failed_ids(self) -> set[int]:
        return {int(n.split(".")[0]) for n in self.list_names("failed") if n.endswith(".json")}

    def is_done(self, task_id: int) -> bool:
        return self.exists(done_file(task_id))

    def read_done(self, task_id: int) -> dict[str, Any]:
        return self.read_json(done_file(task_id))

    def mark_done(self, task_id: int, record: dict[str, Any]) -> None:
        self.write_json(done_file(task_id), record, compact=True)
        self.remove_if_present(failed_file(task_id))

    def mark_failed(self, task_id: int, record: dict[str, Any]) -> None:
        self.write_json(failed_file(task_id), record)

    def record_failure(self, task: Task, error: str, kind: str, *, attempts: int = 1) -> TaskResult:
        """Write why `task` failed (failed/NNNNNN.json) and return the failed TaskResult."""
        try:
            self.mark_failed(task.id, {"task": task.id, "error": error, "kind": str(kind), "inputs": list(task.inputs)})
        except OSError as exc:  # a full disk beside the outputs: say which task, why, and which file
            raise ShardIOError(f"task {task.id} failed ({error}) and its failure record could not be written "
                               f"either: {type(exc).__name__}: {exc}") from exc
        return TaskResult.failed(task.id, error, kind, attempts)

    def write_errors(self, task_id: int, records: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(redact_urls_deep(r), sort_keys=True) + "\n" for r in records)
        name = errors_file(task_id)
        if lines:
            self.write_bytes(name, lines.encode())
        else:
            self.remove_if_present(name)
