"""Backends: they differ only in where `run_task(task, job)` runs.

Each backend is a generator `execute(job, tasks, progress, **options)` that yields TaskResults as
tasks finish; closing the generator must stop outstanding work. `run_job` does everything else the
same way for all of them: the plan, skipping finished tasks, the progress bar, the report.
"""

from __future__ import annotations

import copy
import importlib
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from shardflow.errors import JobError
from shardflow.rundir.lease import RunLease
from shardflow.job.progress import DEFAULT_HEARTBEAT_S, Progress, json_reader, known_total
from shardflow.rundir.report import RunReport, build_report
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.job.trial import prepare_trial

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

Execute = Callable[..., Iterator[TaskResult]]

BACKENDS = {
    "serial": "shardflow.backends.local:execute_serial",
    "processes": "shardflow.backends.local:execute_processes",
    "dask": "shardflow.backends.dask.client:execute_dask",
}


def get_backend(name: str) -> Execute:
    try:
        module, func = BACKENDS[name].split(":")
    except KeyError:
        raise JobError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), func)


def run_job(job: "ShardJob", backend: str = "processes", *, steal: bool = False, **options: Any) -> RunReport:
    """Plan (once), run the pending tasks on `backend`, and return the merged report.

    Ctrl-C stops the workers; shards in progress are discarded and the report says `interrupted`,
    so a rerun picks up where this one stopped. The driver holds the run directory's lease meanwhile
    (rundir.lease: a second driver is refused; `steal` takes over an expired one); a trial run (`limit`)
    writes only to its scratch run and takes none. Options: see `_run_pending`.
    """
    if options.get("limit") is not None:
        return _run_pending(job, backend, **options)
    with RunLease(job.rundir(), steal=steal):
        return _run_pending(job, backend, **options)


def _run_pending(job: "ShardJob", backend: str = "processes", *, force: bool = False,
                 progress: bool | None = None, redo: bool = False, resume_anyway: bool = False,
                 overwrite: bool = False, limit: int | None = None, limit_tasks: int | None = None,
                 debug: bool = False, heartbeat: float | None = DEFAULT_HEARTBEAT_S, **options: Any) -> RunReport:
    """`redo`/`resume_anyway`/`overwrite`: see job.guard; `limit`: a trial on the first samples of each
    task, in a scratch run (job.trial); `debug`: serial, the first failure raises its own exception;
    `heartbeat`: seconds between progress lines off a terminal."""
    execute = get_backend(backend)
    started = time.perf_counter()
    if debug:
        job = _debug_job(job, backend)
    if limit is not None:
        job, run_dir = prepare_trial(job, limit, limit_tasks)
    else:
        run_dir = job.prepare(force=force, redo=redo, resume_anyway=resume_anyway, overwrite=overwrite)
    tasks = job.plan()
    done = run_dir.done_ids()
    pending: list[Task] = [t for t in tasks if t.id not in done]
    total = known_total(pending, json_reader(job.options_for)) if progress is not False and pending else None
    bar = Progress(len(tasks), len(tasks) - len(pending), enabled=progress, total_samples=total, heartbeat=heartbeat)
    results: dict[int, TaskResult] = {}
    interrupted = False
    stream = execute(job, pending, bar, **options)
    try:
        for result in stream:
            results[result.task_id] = result
            bar.task_finished(result)
            if result.stops_run(job.on_error):
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stream.close()
        bar.close()
    skipped = len(tasks) - len(pending) + sum(r.status == "skipped" for r in results.values())
    return build_report(run_dir, [t.id for t in tasks], results, started, skipped=skipped, interrupted=interrupted)


def _debug_job(job: "ShardJob", backend: str) -> "ShardJob":
    """A copy of the job whose first failure raises the original exception (run_task catches nothing)."""
    if backend != "serial":
        raise JobError("debug=True runs in this process: use the 'serial' backend")
    debug_job = copy.copy(job)
    debug_job.debug = True
    return debug_job
