"""`shardflow worker`: run one chunk of a planned job inside a pod (Kubernetes, Argo, any batch system).

A chunk is a fixed slice of task ids: index I with K tasks per index runs tasks [I*K, (I+1)*K) of the
plan in the run directory, through the same `run_task` every backend uses, with the job unpickled
from the run directory. Tasks already marked done are skipped, so rerunning an index is always safe.
A task that killed an earlier process of the chunk (a native crash on one of its samples) runs after
the others, and fails instead of running once it did so more than io_retries times (cluster.dead_attempts).

The exit status tells the orchestrator what to do next (Kubernetes podFailurePolicy, Argo
retryStrategy); see `EXIT_CODES` and docs/kubernetes.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any, Iterator, TextIO

from shardflow.cluster import jobsource
from shardflow.cluster.contract import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_OK,
    EXIT_RETRY,
    EXIT_STOP,
    STOP_SIGNALS,
    WorkerExit,
    chunk_of,
    exit_code,
)
from shardflow.cluster.dead_attempts import DeadAttempts
from shardflow.cluster.heartbeat import ChunkHeartbeat
from shardflow.errors import JobError, RunStateError
from shardflow.rundir.layout import failed_file
from shardflow.rundir.report import RunReport, build_report
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.summaries import SPAN, block_of, merge_span, write_block
from shardflow.rundir.tasks import TaskResult
from shardflow.storage import options as so
from shardflow.task.run_task import run_task
from shardflow.task.threads import limit_threads


class Preempted(BaseException):
    """Raised by the handler of STOP_SIGNALS (SIGTERM, SIGINT, Slurm's warning SIGUSR1). A BaseException,
    so that run_task does not record it as a task failure: the writers abort (nothing half-written stays
    visible) and the worker exits 75."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals(signums: tuple[int, ...] = tuple(getattr(signal, name) for name in STOP_SIGNALS)
                    ) -> Iterator[None]:
    """Turn STOP_SIGNALS into `Preempted` while the block runs (main thread only).

    Only the first signal raises: a cancelled Slurm job's worker gets SIGTERM twice (from slurmstepd
    and from the batch shell passing it on), and a second `Preempted` raised inside the first one's
    cleanup (a writer's abort, between closing its temp file and unlinking it) left that temp behind.
    """
    stopping = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal stopping
        if stopping:  # already unwinding: let the cleanup finish
            return
        stopping = True
        raise Preempted(signum)

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def open_run_dir(url: str, storage_options: dict[str, Any] | None) -> tuple[RunDir, dict[str, Any]]:
    """The run directory and its plan; failures mapped to exit codes (unreachable: retry)."""
    try:
        run_dir = RunDir(url, storage_options)
    except OSError as exc:  # a filesystem that connects when created
        raise WorkerExit(EXIT_RETRY, f"run directory {url} unreachable: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - s3fs/gcsfs missing from the image, bad options, unset ${VAR}
        raise WorkerExit(EXIT_STOP, f"cannot use run directory {url}: {type(exc).__name__}: {exc}") from exc
    try:
        plan = run_dir.load_plan()
    except RunStateError as exc:  # plan.json unreadable: the line names it and says what to do
        raise WorkerExit(EXIT_STOP, str(exc)) from exc
    except JobError as exc:  # reachable, but no plan.json: the Job was submitted before the plan
        raise WorkerExit(EXIT_STOP, f"{exc}; write it with `shardflow k8s/argo/slurm` (without --no-prepare) "
                                    "or `shardflow worker --prepare JOBFILE --run-dir URL` before starting the "
                                    "workers") from exc
    except Exception as exc:  # noqa: BLE001 - network, permissions, throttling: all worth a retry
        raise WorkerExit(EXIT_RETRY, f"run directory {url} unreachable: {type(exc).__name__}: {exc}") from exc
    return run_dir, plan


def load_run_job(run_dir: RunDir, *, rebind: bool = False) -> Any:
    """The job (see cluster.jobsource), bound to `run_dir` (the URL this pod reaches it by).

    With `rebind`, the run directory is reopened with the job's own storage options for its URL
    (`${VAR}` references resolve in this pod's environment), for workers given no options.
    """
    job = jobsource.load_job(run_dir)  # from the job file's source, or job.pkl after a version check
    # the pod may reach the run directory by another URL or options than the submitter did
    if rebind:
        try:
            options = job.options_for(run_dir.url)
        except KeyError as exc:  # a ${VAR} reference this pod's environment does not set
            raise WorkerExit(EXIT_STOP, f"storage options of the run directory: {exc.args[0]}") from exc
        if options:
            run_dir = RunDir(run_dir.url, options)
    return job.at_run_dir(run_dir)


def chunk_exit_code(results: list[TaskResult], on_error: str) -> int:
    """One exit status for a chunk's results (see contract.exit_code)."""
    return exit_code([r.kind for r in results if r.status == "failed"], on_error)


def _log(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def run_chunk(url: str, index: int, tasks_per_index: int = 1, *, storage_options: dict[str, Any] | None = None,
              out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the tasks of one index; returns the exit status (see EXIT_CODES). Never raises for a failure."""
    try:
        with stop_on_signals():
            return _run_chunk(url, index, tasks_per_index, storage_options, out)
    except Preempted as exc:
        _log(err, f"shardflow worker: index {index} stopped by {exc}; unfinished work discarded, retry later")
        return EXIT_RETRY
    except WorkerExit as exc:
        _log(err, so.scrub(f"shardflow worker: index {index}: {exc} (exit {exc.code})", storage_options))
        return exc.code
    except RunStateError as exc:  # a plan chunk unreadable: retrying reads the same bytes, so stop the run
        _log(err, so.scrub(f"shardflow worker: index {index}: {exc} (exit {EXIT_STOP})", storage_options))
        return EXIT_STOP


def _run_chunk(url: str, index: int, tasks_per_index: int, storage_options: dict[str, Any] | None,
               out: TextIO) -> int:
    started = time.perf_counter()
    run_dir, plan = open_run_dir(url, storage_options)
    tasks = run_dir.task_count(plan)
    chunk = chunk_of(index, tasks_per_index, tasks)
    job = load_run_job(run_dir, rebind=storage_options is None)
    if "OMP_NUM_THREADS" in os.environ:  # the manifest sets it from --cpu: torch follows it too
        limit_threads()
    results: list[TaskResult] = []
    beat = ChunkHeartbeat(index, len(chunk.task_ids), _log, out)
    dead = DeadAttempts(job, chunk.task_ids)  # tasks that killed an earlier process of this chunk: last
    try:
        dead.scan()
    except Exception as exc:  # noqa: BLE001 - the run directory's listings failed: worth a retry
        raise WorkerExit(EXIT_RETRY, f"reading running/ and records/: {type(exc).__name__}: {exc}") from exc
    for task in dead.order(run_dir.load_tasks(plan, chunk.task_ids)):  # only this chunk's part of the plan
        beat.start_task(task.id)
        try:
            # records task failures itself; what escapes is run-dir trouble
            result = dead.verdict(task) or run_task(task, job, progress=beat)
        except RunStateError:  # an unreadable file of it (a done marker): named, exit 78, not retried
            raise
        except Exception as exc:  # noqa: BLE001 - the run directory went away mid-chunk
            raise WorkerExit(EXIT_RETRY, f"task {task.id}: {type(exc).__name__}: {exc}") from exc
        results.append(result)
        beat.end_task()
        line = f"task {task.id}: {result.status}"
        if result.status == "failed":
            line += f" [{result.kind}] {result.error}"
        else:
            line += f" ({result.stats.samples_in} samples in, {result.stats.samples_out} out)"
        _log(out, so.scrub(line, job.storage_options))
        if result.status == "failed" and chunk_exit_code([result], job.on_error) == EXIT_STOP:
            break
    code = chunk_exit_code(results, job.on_error)
    done = sum(r.ok for r in results)
    if done == len(chunk.task_ids):  # the whole chunk is done: status and finalize read one file for it
        with contextlib.suppress(Exception):  # best effort: without it they read the chunk's markers
            job_dir = job.rundir()
            in_order = sorted(results, key=lambda r: r.task_id)  # suspects ran last (cluster.dead_attempts)
            write_block(job_dir, block_of(chunk.first, chunk.stop, ((r.stats, r.outputs) for r in in_order)))
            if chunk.stop - chunk.first < SPAN:  # the pod completing a SPAN range merges its pods' summaries
                merge_span(job_dir, chunk.first, tasks)
    _log(out, f"index {index}: {done}/{len(chunk.task_ids)} tasks done in {time.perf_counter() - started:.1f} s "
              f"-> exit {code} ({EXIT_CODES[code]})")
    return code


def finalize(url: str, *, storage_options: dict[str, Any] | None = None, out: TextIO = sys.stdout,
             err: TextIO = sys.stderr) -> int:
    """Rebuild summary.json from the done/ and failed/ markers; 0 when every task is done.

    Exit 65 when the run is incomplete (failed or missing tasks: rerunning this step changes nothing),
    75 when the run directory is unreachable, 78 when it holds no plan.
    """
    try:
        with stop_on_signals():
            run_dir, plan = open_run_dir(url, storage_options)
            try:
                report = write_summary(run_dir, plan)
            except Exception as exc:  # noqa: BLE001
                raise WorkerExit(EXIT_RETRY, f"cannot write summary: {type(exc).__name__}: {exc}") from exc
    except Preempted as exc:
        _log(err, f"shardflow worker --finalize: stopped by {exc}")
        return EXIT_RETRY
    except WorkerExit as exc:
        _log(err, so.scrub(f"shardflow worker --finalize: {exc} (exit {exc.code})", storage_options))
        return exc.code
    _log(out, str(report))
    if report.ok:
        return EXIT_OK
    missing = report.tasks - report.done - len(report.failed)
    _log(err, f"shardflow worker --finalize: run incomplete: {len(report.failed)} failed, {missing} never finished; "
              f"see {run_dir.url}/summary.json")
    return EXIT_BAD_INPUT


def write_summary(run_dir: RunDir, plan: dict[str, Any] | None = None) -> RunReport:
    """summary.json rebuilt from the markers alone (after pods, whatever ran them); returns the RunReport."""
    plan = plan if plan is not None else run_dir.load_plan()
    task_ids = list(range(run_dir.task_count(plan)))
    done = run_dir.done_ids()
    results: dict[int, TaskResult] = {}
    for task_id in sorted(run_dir.failed_ids() - done):
        try:
            record = run_dir.read_json(failed_file(task_id))
        except FileNotFoundError:
            continue
        results[task_id] = TaskResult.failed(task_id, record.get("error"), record.get("kind"))
    return build_report(run_dir, task_ids, results, time.perf_counter(), skipped=len(done & set(task_ids)))
