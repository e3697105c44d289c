"""Retrying the finished tasks that dropped samples (`--retry-failed`, `job.run(retry_failed=True)`).

Under on_error="skip" a task whose function raised for a few samples (or whose decode failed) still ends
"done": those samples are left out of its outputs, counted in its record and listed in errors/. A plain
rerun skips it (it has its marker), and `--redo` recomputes every clean task too. Once the cause is fixed
(a bug for some inputs, a missing dependency, a flaky model server) the user wants exactly those tasks
again: this module finds them and forgets that they are done, so the driver runs them as pending tasks
through the one path (run_task), which rewrites all their outputs and their error log.

What counts is Stats.failed: samples that could not be read, decoded, processed or encoded. Samples the
function skipped on purpose (SkipSample: Stats.skipped) or filtered out (returned None: Stats.dropped)
are the job's choice, not a loss: a task with only those is clean and is not run again.

Finding them costs one listing of records/ (a task's counts are in its record's name: rundir.records);
markers are read only for done tasks with no done record (an older shardflow's run).

Forgetting is ordered so that a run killed at any point leaves a run directory that a later run (with or
without --retry-failed) completes with every sample exactly once:

1. summary.json and last_run.json: they list these tasks' outputs and checksums, which the retry replaces
   (the run's report writes them again);
2. every per-chunk summary (summaries/) whose range holds one of them: `RunDir.done_ids` trusts summaries
   that cover the plan, and reports take a range's stats from its summary, so a marker removed under a
   summary would still read as done, and its old counts would be added to the new ones;
3. their done markers: from here the tasks are not done, and any run runs them whole (the writer replaces
   each part by name and removes the parts past its new count before it writes the marker again);
4. their error logs (errors/): the old run's failures; the retry writes its own.

Each step is idempotent. Killed before step 3, the tasks are still done: a plain rerun resumes (and writes
the summaries again), and --retry-failed finds them again by their records. Nothing here touches an
output shard: outputs are rewritten only by the tasks' new runs, after their markers are gone.
"""

from __future__ import annotations

from typing import Iterable

from shardflow.rundir.layout import LAST_RUN, RECORDS, SUMMARIES, SUMMARY, done_file, errors_file
from shardflow.rundir.records import DONE, latest, parse_record
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.summaries import summaries_holding

__all__ = ["dropped_sample_tasks", "forget_done", "forget_tasks_that_dropped_samples", "retry_note", "task_ids_text"]


def dropped_sample_tasks(run_dir: RunDir, tasks: int, done_ids: set[int]) -> list[int]:
    """The done tasks (of `done_ids`, in [0, tasks)) whose last run counted failed samples, in order."""
    found: set[int] = set()
    recorded: set[int] = set()
    names = run_dir.list_names(RECORDS, tasks=tasks)
    for record in latest(r for r in map(parse_record, names) if r is not None and 0 <= r.task < tasks):
        if record.state != DONE or record.stats is None or record.task not in done_ids:
            continue  # not done (a record without its marker: the task runs anyway), or a failed record
        recorded.add(record.task)
        if record.stats.failed > 0:
            found.add(record.task)
    unrecorded = sorted(t for t in done_ids if 0 <= t < tasks and t not in recorded)
    for task_id, marker in zip(unrecorded, run_dir.read_many([done_file(t) for t in unrecorded])):
        if isinstance(marker, dict) and int((marker.get("stats") or {}).get("failed") or 0) > 0:
            found.add(task_id)
    return sorted(found)


def forget_done(run_dir: RunDir, ids: Iterable[int]) -> None:
    """Make the done tasks `ids` pending again, in the kill-safe order of the module docstring."""
    chosen = sorted(set(ids))
    if not chosen:
        return
    run_dir.remove_many([SUMMARY, LAST_RUN])
    run_dir.remove_many([f"{SUMMARIES}/{name}" for name in summaries_holding(run_dir.list_names(SUMMARIES), chosen)])
    run_dir.remove_many([done_file(t) for t in chosen])
    run_dir.remove_many([errors_file(t) for t in chosen])


def forget_tasks_that_dropped_samples(run_dir: RunDir) -> list[int]:
    """Find the done tasks of `run_dir`'s plan that dropped samples and forget them; their ids, in order."""
    tasks = run_dir.task_count(run_dir.load_plan())
    done = {t for t in run_dir.done_ids(tasks) if 0 <= t < tasks}
    ids = dropped_sample_tasks(run_dir, tasks, done)
    forget_done(run_dir, ids)
    return ids


def task_ids_text(ids: list[int], shown: int = 10) -> str:
    """'tasks 1, 3' / 'tasks 0, 1, ... (250 in all)': the ids a message names."""
    text = ", ".join(map(str, ids[:shown]))
    more = f", ... ({len(ids)} in all)" if len(ids) > shown else ""
    return f"task{'' if len(ids) == 1 else 's'} {text}{more}"


def retry_note(ids: list[int]) -> str:
    """The line a run with --retry-failed shows: which finished tasks run again, or that none does."""
    if not ids:
        return "--retry-failed: no finished task dropped samples: nothing to retry; resuming as a plain rerun"
    return (f"--retry-failed: retrying {len(ids)} finished task{'' if len(ids) == 1 else 's'} that dropped samples "
            f"({task_ids_text(ids)}): their outputs and error logs are written again")
