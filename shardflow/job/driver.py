"""The driver: everything a run does the same way whatever the backend (the lease, the plan, skipping
finished tasks, the progress bar, the report); backends differ only in where `run_task` runs and are
found by name in job/backend_registry.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from shardflow.errors import JobError
from shardflow.job.backend_registry import backend as get_backend
from shardflow.job.progress import DEFAULT_HEARTBEAT_S, Progress, json_reader, known_total
from shardflow.job.rerun import Rerun, stream_of
from shardflow.job.trial import prepare_trial
from shardflow.rundir.beats import stop_idle_beats
from shardflow.rundir.lease import RunLease
from shardflow.rundir.report import RunReport, build_report
from shardflow.rundir.summaries import LiveSpans
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.storage.stale_uploads import abort_left_uploads

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def run_job(job: "ShardJob", backend: str = "processes", *, steal: bool = False, **options: Any) -> RunReport:
    """Plan (once), run the pending tasks on `backend`, and return the merged report.

    Ctrl-C stops the workers; shards in progress are discarded and the report says `interrupted`,
    so a rerun picks up where this one stopped. The driver holds the run directory's lease meanwhile
    (rundir.lease: a second driver is refused; `steal` takes over an expired one); a trial run (`limit`)
    writes only to its scratch run and takes none. Options: see `_run_pending`.
    """
    try:
        if options.get("limit") is not None:
            return _run_pending(job, backend, **options)
        with RunLease(job.rundir(), steal=steal) as lease:
            return _run_pending(job, backend, lease=lease, **options)
    finally:
        stop_idle_beats()  # tasks run in this process (serial) leave no beat thread behind


def _run_pending(job: "ShardJob", backend: str = "processes", *, force: bool = False,
                 progress: bool | None = None, redo: bool = False, resume_anyway: bool = False,
                 overwrite: bool = False, extend: bool = False, retry_failed: bool = False,
                 limit: int | None = None, limit_tasks: int | None = None,
                 debug: bool = False, heartbeat: float | None = DEFAULT_HEARTBEAT_S,
                 lease: RunLease | None = None, **options: Any) -> RunReport:
    """`redo`/`resume_anyway`/`overwrite`/`extend`/`retry_failed`: what to do with the run directory's
    progress and plan (job.rerun.Rerun); `limit`: a trial on the first samples of each task, in a scratch
    run (job.trial); `debug`: serial, the first failure raises its own exception; `heartbeat`: seconds
    between progress lines off a terminal; `lease`: checked between tasks, so a driver whose lease another
    took starts no further task (LeaseLost)."""
    rerun = Rerun.of(force=force, redo=redo, resume_anyway=resume_anyway, overwrite=overwrite, extend=extend,
                     retry_failed=retry_failed).for_stream(stream_of(job.spec.inputs, job.spec.outputs))
    if retry_failed and limit is not None:
        raise JobError("retry_failed=True (--retry-failed) retries tasks of the run directory; a trial (limit, "
                       "--limit) runs in a scratch run of its own: give one of them")
    execute = get_backend(backend)
    started = time.perf_counter()
    if debug:
        if backend != "serial":
            raise JobError("debug=True runs in this process: use the 'serial' backend")
        job = job.replace(debug=True)  # the first failure raises the original exception (run_task catches nothing)
    notes: tuple[str, ...] = ()
    if limit is not None:
        job, run_dir = prepare_trial(job, limit, limit_tasks)
    else:
        prepared = job.prepare_run(rerun)
        run_dir, notes = prepared.run_dir, prepared.notes
    done = run_dir.done_ids()
    count = run_dir.task_count(run_dir.load_plan())
    if len(done) >= count and all(i in done for i in range(count)):
        ids: list[int] | range = range(count)  # nothing left (a no-op resume): the plan's tasks are not built
        pending: list[Task] = []
    else:
        tasks = job.plan()
        ids = [t.id for t in tasks]
        pending = [t for t in tasks if t.id not in done]
    total = known_total(pending, json_reader(job.options_for)) if progress is not False and pending else None
    bar = Progress(len(ids), len(ids) - len(pending), enabled=progress, total_samples=total, heartbeat=heartbeat)
    results: dict[int, TaskResult] = {}
    interrupted = False
    if lease is not None:
        lease.check()  # planning may have taken longer than the lease lives
    spans = LiveSpans(run_dir, ids, (t.id for t in pending))  # a killed driver leaves them: no marker per task
    stream = execute(job, pending, bar, **options)
    try:
        for result in stream:
            results[result.task_id] = result
            spans.finished(result, results)
            bar.task_finished(result)
            if result.stops_run(job.spec.on_error):
                break
            if lease is not None:
                lease.check()  # before the backend is asked for (and starts) another task
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stream.close()
        bar.close()
    if not interrupted and len(results) == len(pending):  # no task of this run is in flight any more
        abort_left_uploads(((t.output, t.output_parts) for t in pending), job.options_for)  # storage.stale_uploads
    skipped = len(ids) - len(pending) + sum(r.status == "skipped" for r in results.values())
    return build_report(run_dir, list(ids), results, started, skipped=skipped, interrupted=interrupted,
                        written=spans.written, notes=notes)

