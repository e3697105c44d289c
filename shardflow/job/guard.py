"""Safe outputs: checks `ShardJob.prepare()` makes before a run writes anything.

- Outputs that resolve to an input are refused (a run in place would destroy its inputs, and the
  samples that failed would be gone for good).
- A planned output name (or rollover part) that already exists and that no run of this run directory
  wrote is refused unless `overwrite=True` (`--overwrite`); other shards beside the outputs are fine.
- A rerun whose code (job file, function, PARAMS: `job.fingerprint`) differs from the code recorded
  in plan.json is refused unless `redo=True` (`--redo`: every task again, into fresh outputs) or
  `resume_anyway=True` (`--resume-anyway`: keep the finished tasks, run the rest with the new code).
- The default run directory: `_shardflow` beside the outputs when it is free or holds this job's
  plan, else `_shardflow-<job>-<hash>` (job.fingerprint.default_run_dir_name), so two jobs writing
  into one output directory keep their progress apart.
"""

from __future__ import annotations

import functools
import os
import re
import string
from typing import TYPE_CHECKING, Any, Callable, Iterable

from shardflow.errors import JobError
from shardflow.job.fingerprint import code_difference, code_fingerprint, default_run_dir_name, same_code
from shardflow.rundir.layout import DEFAULT_NAME, PLAN
from shardflow.rundir.plan_table import TaskTable
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.shards import formats
from shardflow.storage.atomic import is_temp_name
from shardflow.storage.paths import filesystem, is_local, join, local_path, protocol

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

MAX_DIRS_LISTED = 64  # output directories looked into (a pattern with {task} in the folder has many)


def _canonical(url: str) -> str:
    """One spelling per location: local paths resolved (symlinks, `..`, file://), remote URLs as given."""
    head, _, base = url.rpartition("/")
    if is_local(url):
        return _local_folder(head if "/" in url else ".") + "/" + base
    proto, _, rest = url.partition("://")
    return f"{proto}://{rest.lstrip('/')}"


@functools.lru_cache(maxsize=4096)
def _local_folder(path: str) -> str:
    """A local folder resolved once (a plan of 100,000 tasks has a few folders, not 100,000)."""
    return "file://" + os.path.realpath(os.path.expanduser(local_path(path or "/")))


def _parts_key(output_parts: str) -> tuple[str, str]:
    """A task's rollover part format string (`d/x_{part:03d}.tar`) as (the canonical URL up to its first
    field, the canonical format string), compiled to a regex only when a shard needs checking."""
    head, slash, base = output_parts.rpartition("/")
    directory = _canonical((head if slash else ".").replace("{{", "{").replace("}}", "}") + "/x")[:-1]
    literal = next(iter(string.Formatter().parse(base)), ("", None, None, None))[0]
    return directory + literal, directory + base


@functools.lru_cache(maxsize=1024)
def _parts_regex(canonical_parts: str) -> re.Pattern[str]:
    head, _, base = canonical_parts.rpartition("/")
    regex = "".join(re.escape(lit) + (r"\d+" if field is not None else "")
                    for lit, field, _, _ in string.Formatter().parse(base))
    return re.compile(re.escape(head + "/") + regex)


class _Resolver:
    """Canonical input URLs with symlinked local FILES resolved to what they point at (`in/a.tar ->
    data/a.tar` is data/a.tar), found from one scandir per input folder: its entries' types come with
    the listing, so only the links cost a system call each."""

    def __init__(self) -> None:
        self._links: dict[str, set[str]] = {}

    def __call__(self, url: str) -> str:
        canonical = _canonical(url)
        if not is_local(url):
            return canonical
        folder, _, base = canonical.rpartition("/")
        if folder not in self._links:
            self._links[folder] = _symlinks(folder.removeprefix("file://"))
        if base in self._links[folder]:
            return "file://" + os.path.realpath(canonical.removeprefix("file://"))
        return canonical

    def link_targets(self) -> set[str]:
        """The canonical folders the symlinked inputs seen so far point into."""
        return {"file://" + os.path.dirname(os.path.realpath(f"{folder.removeprefix('file://')}/{name}"))
                for folder, names in self._links.items() for name in names}


def _symlinks(folder: str) -> set[str]:
    try:
        with os.scandir(folder) as entries:
            return {e.name for e in entries if e.is_symlink()}
    except OSError:
        return set()


def check_not_in_place(tasks: list[Task], inputs_spec: Any = None, *, extend_hint: bool = False) -> None:
    """Refuse outputs (or their rollover parts) that resolve to any input shard, symlinked inputs
    included (compared by where they point, whatever --overwrite says).

    An input that is ANOTHER task's output is most often a glob over the output folder that now matches
    what an earlier run wrote (`-i 'data/*.tar' -o 'data/{name}-x.tar'`, run again): said as such, with
    the two ways out; `extend_hint` (a stored plan is there) adds the one that keeps it (--extend)."""
    resolve = _Resolver()
    inputs = {resolve(u): (u, t.id) for t in tasks for u in t.inputs}
    for task in tasks:
        for name in (task.output, task.part_url(1)):
            found = inputs.get(_canonical(name))
            if found is None:
                continue
            if found[1] == task.id:
                raise JobError(f"output {name} of task {task.id} is the input shard {found[0]}: a run in place "
                               "would destroy its inputs; write the outputs somewhere else")
            which = f"inputs {inputs_spec!r}" if isinstance(inputs_spec, str) else "inputs"
            raise JobError(f"the {which} match {found[0]}, this job's own output (task {task.id}'s, as an "
                           "earlier run wrote it?): use an inputs glob that excludes the outputs, or write the outputs "
                           "to another folder" + (", or pass --extend (extend=True) to add only the new inputs to the "
                                                  "stored plan" if extend_hint else ""))


def own_outputs(tasks: Iterable[Task]) -> Callable[[str], bool]:
    """Whether a URL is a name `tasks` write (an output or a rollover part), symlinks resolved: the first
    run's outputs that a glob over the output folder matches on a rerun (stored_plan_tasks, job.extend)."""
    names, patterns = _planned(tasks)
    resolve = _Resolver()
    return lambda url: _ours(resolve(url), names, patterns)


def inputs_at(outputs: Iterable[str], inputs: Iterable[str]) -> dict[str, str]:
    """output -> the input it resolves to, for each of `outputs` that is one of `inputs`: the comparison of
    check_not_in_place, for the tools that write files outside the job runner (head, create, tsv, show,
    index, report)."""
    resolve = _Resolver()
    found = {resolve(u): u for u in inputs}
    return {output: found[where] for output in outputs if (where := _canonical(output)) in found}


def _planned(tasks: Iterable[Task]) -> tuple[set[str], dict[str, list[str]]]:
    names: set[str] = set()
    patterns: dict[str, list[str]] = {}
    for task in tasks:
        names.add(_canonical(task.output))
        prefix, parts = _parts_key(task.output_parts)
        patterns.setdefault(prefix, []).append(parts)
    return names, patterns


def _ours(url: str, names: set[str], patterns: dict[str, list[str]]) -> bool:
    if url in names:
        return True
    return any(_parts_regex(p).fullmatch(url) for end in range(len(url), 0, -1) for p in patterns.get(url[:end], ()))


def _existing_shards(directory: str, options: dict[str, Any] | None) -> list[str]:
    """Canonical URLs of the (final, non-temp) shards in `directory`; empty when it does not exist."""
    fs, path = filesystem(directory, options)
    try:
        entries = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in entries:
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        if formats.is_shard_name(base) and not base.startswith(".") and not is_temp_name(base):
            url = entry if is_local(directory) else f"{protocol(directory)}://{entry.split('://', 1)[-1]}"
            out.append(_canonical(url))
    return out


def check_foreign_shards(job: "ShardJob", tasks: list[Task] | Callable[[], list[Task]], run_dir: RunDir, *,
                         directories: list[str] | None = None, stored: dict[str, Any] | None = None) -> None:
    """Refuse to overwrite a shard that no run of this run directory wrote.

    Only what a run would really overwrite is looked at: an existing shard under a name this plan gives
    (part 0, or a rollover part). Other shards in the output folders (another dataset, the inputs) are
    left alone and do not stop the run. A name the plan stored in the run directory (`stored`, any
    version) also gives is this run directory's own (a rerun, a rerun with fewer inputs); before a first
    run nothing is. Cost: one listing per output folder, then a set lookup per existing shard; the
    stored plan's tasks are read only when an existing shard collides with a planned name.
    """
    if stored is not None and stored.get("overwrite"):
        return  # an earlier run of this run directory was told to write there anyway
    if directories is None:
        tasks = tasks() if callable(tasks) else tasks
        directories = sorted({t.output.rpartition("/")[0] or "." for t in tasks})
    existing = [(d, url) for d in directories[:MAX_DIRS_LISTED] for url in _existing_shards(d, job.options_for(d))]
    if not existing:  # a first run into empty folders (a million tasks from a table: no task is made)
        return
    tasks = tasks() if callable(tasks) else tasks
    names, patterns = _planned(tasks)
    hits = [(d, url) for d, url in existing if _ours(url, names, patterns)]
    if hits:
        resolve = _Resolver()
        inputs = {resolve(u) for t in tasks for u in t.inputs}
        hits = [(d, url) for d, url in hits if url not in inputs]
    if hits and stored is not None:  # a rerun: the names its stored plan gives are its own
        old_names, old_patterns = _planned(run_dir.load_tasks(stored, range(run_dir.task_count(stored))))
        hits = [(d, url) for d, url in hits if not _ours(url, old_names, old_patterns)]
    if hits:
        directory, url = hits[0]
        more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        raise JobError(f"output {url.rsplit('/', 1)[-1]}{more} in {directory} already exists and no run of this "
                       f"run directory ({run_dir.url}) wrote it: it could be another dataset's; choose other "
                       "output names, or pass --overwrite (overwrite=True) to replace it")


def stored_plan_tasks(tasks: list[Task], run_dir: RunDir, stored: dict[str, Any] | None) -> list[Task] | None:
    """The stored plan's tasks when the new plan differs from it only by inputs that are the stored plan's
    own outputs (`split '*.tar' -o '{name}-{part:04d}.tar'` run twice: the glob now matches the first
    run's outputs); None otherwise. A rerun then resumes the plan it started with."""
    if stored is None:
        return None
    old = list(run_dir.load_tasks(stored, range(run_dir.task_count(stored))))
    names, patterns = _planned(old)
    resolve = _Resolver()
    kept = [u for t in tasks for u in t.inputs if not _ours(resolve(u), names, patterns)]
    if kept != [u for t in old for u in t.inputs]:
        return None
    return old


def check_outputs(job: "ShardJob", tasks: list[Task] | None, table: dict[str, Any] | None, run_dir: RunDir,
                  stored: dict[str, Any] | None, *, overwrite: bool = False) -> list[Task] | None:
    """The checks of a plan that is not the one stored in `run_dir` (a first run, or another plan): not in
    place, no foreign shard overwritten. Returns the stored plan's tasks when the rerun resumes them
    (stored_plan_tasks), else None."""
    if table is not None:
        check_table(job, table, run_dir, overwrite=overwrite, stored=stored)
        return None
    assert tasks is not None
    try:
        check_not_in_place(tasks, job.spec.inputs, extend_hint=stored is not None)
    except JobError:
        resumed = stored_plan_tasks(tasks, run_dir, stored)
        if resumed is None:
            raise
        return resumed
    if not overwrite:
        check_foreign_shards(job, tasks, run_dir, stored=stored)
    return None


def check_table(job: "ShardJob", table: dict[str, Any], run_dir: RunDir, *, overwrite: bool = False,
                stored: dict[str, Any] | None = None) -> None:
    """The checks above for a plan given as a table (rundir.plan_table): decided from the folders its
    columns name, so a million-task plan whose outputs go to other folders than its inputs, into empty
    folders, is checked without making one Task. Otherwise the tasks are made (once) and checked."""
    made: list[list[Task]] = []

    def tasks() -> list[Task]:
        if not made:
            made.append(list(TaskTable(table).tasks(range(int(table["count"])))))
        return made[0]

    inputs, outputs, parts = (_table_folders(table[c]) for c in ("inputs", "outputs", "output_parts"))
    if inputs is None or outputs is None or parts is None or (
            _input_folders(inputs) & {_canonical_folder(f) for f in outputs | parts}):
        check_not_in_place(tasks())  # inputs and outputs may share a folder: compare every name
    if not overwrite:
        check_foreign_shards(job, tasks, run_dir, directories=None if outputs is None else sorted(outputs),
                             stored=stored)


def _table_folders(runs: list[dict[str, Any]]) -> set[str] | None:
    """The folders a table column's names are in (None when a run's number is in a folder name)."""
    folders: set[str] = set()
    for run in runs:
        if "l" not in run and "/" in run["s"]:
            return None
        for name in run["l"] if "l" in run else [f"{run['p']}0{run['s']}"]:
            folders.add(name.replace("{{", "{").replace("}}", "}").rpartition("/")[0] or ".")
    return folders


def _canonical_folder(folder: str) -> str:
    return _canonical(folder + "/x").rpartition("/")[0]


def _input_folders(folders: set[str]) -> set[str]:
    """Canonical input folders, and the folders symlinked files in them point into (one scandir each)."""
    canonical = {_canonical_folder(f) for f in folders}
    resolve = _Resolver()
    for folder in canonical:
        if folder.startswith("file://"):
            resolve(folder + "/x")
    return canonical | resolve.link_targets()


def check_code(job: "ShardJob", run_dir: RunDir, *, redo: bool = False, resume_anyway: bool = False,
               overwrite: bool = False, retry_failed: bool = False) -> dict[str, Any]:
    """After the plan is written: refuse a run directory planned with other code unless told what to do.

    `redo`: forget every finished task (they rerun and rewrite their outputs), with the same code too: a
    redo is "start over", whatever changed; `resume_anyway`: keep them. Either way plan.json then records
    the new code. `overwrite` is recorded too (reruns do not ask again). The plan itself is kept: init_plan
    has just stored it (with its chunk files, which a redo must not delete).
    """
    code = code_fingerprint(job)
    plan = run_dir.read_json(PLAN)
    old = plan.get("code")
    if old is not None and same_code(old, code) and not redo:
        if overwrite and not plan.get("overwrite"):
            run_dir.write_json(PLAN, {**plan, "overwrite": True})
        return code
    if old is not None and not (redo or resume_anyway):
        if retry_failed:  # (rundir.retry) the tasks that dropped samples are to run again with the new code
            raise JobError(f"the job's code differs from the code that planned run directory {run_dir.url} "
                           f"({code_difference(old, code)}): pass --retry-failed --resume-anyway (retry_failed="
                           "True, resume_anyway=True) to keep the finished tasks of the old code and run the ones "
                           "that dropped samples with the new code, or --redo alone to run every task again")
        raise JobError(f"the job's code differs from the code that planned run directory {run_dir.url} "
                       f"({code_difference(old, code)}): pass --redo (redo=True) to run every task again into "
                       "fresh outputs, or --resume-anyway (resume_anyway=True) to keep the finished tasks")
    if redo:
        run_dir.forget_progress()
    recorded = {**plan, "code": code, **({"overwrite": True} if overwrite else {})}
    run_dir.write_json(PLAN, recorded)  # old plans (no "code" key) adopt the current code
    return code


def default_run_dir(job: "ShardJob", head: str) -> str:
    """`head/_shardflow` when free or holding this job's plan, else `head/_shardflow-<job>-<hash>`.

    Storage that cannot be looked at here (no credentials where only the cluster writes the bucket:
    `k8s --no-prepare`) gives `_shardflow`, the name every earlier release used.
    """
    own = join(head, default_run_dir_name(job))
    shared = join(head, DEFAULT_NAME)
    try:
        if RunDir(own, job.options_for(own)).exists(PLAN):
            return own
        rundir = RunDir(shared, job.options_for(shared))
        if not rundir.exists(PLAN):
            return shared
        name = rundir.read_json(PLAN).get("job", {}).get("name")
    except Exception:  # noqa: BLE001 - unreachable or unreadable: the classic name, decided without looking
        return shared
    return shared if name == job.name else own
