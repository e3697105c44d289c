"""`job.run("slurm")`: submit the pending chunks as a job array and follow them to the end.

A backend like the others (job.backend_registry): the driver has written the plan and holds the lease;
this generator submits (submit.py), then yields a TaskResult for each task as its marker appears in
the run directory (done/, failed/), which is what the array tasks write, so the progress bar and the
report are the other backends'. When every task has its marker, the finalize job is cancelled (the
driver writes summary.json itself) and the run returns once the array has left the queue. A task still
without a marker when squeue says the array has ended (scancel, a time limit, a node lost) is reported
failed with kind `io` (a rerun resubmits it).

Closing the generator early (the driver stops on a user bug, or Ctrl-C) cancels the array and its
finalize job (the driver writes the report) and waits until their workers have stopped; on Ctrl-C at a
terminal it asks first, since the jobs may be worth leaving to finish without this process.
"""

from __future__ import annotations

import sys
import time as clock
from typing import TYPE_CHECKING, Iterator, Sequence

from shardflow.cluster.slurm import queue
from shardflow.cluster.slurm.options import from_job
from shardflow.cluster.slurm.submit import Submission, submit
from shardflow.errors import FailureKind
from shardflow.rundir.layout import failed_file
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task, TaskResult

if TYPE_CHECKING:
    from shardflow.job.progress import Progress
    from shardflow.job.shard_job import ShardJob

POLL_SECONDS = 2.0  # between listings of done/ and failed/
QUEUE_SECONDS = 10.0  # between squeue calls (a fork + exec and a slurmctld RPC: ~15 ms of CPU each)
CANCEL_WAIT = 60.0  # seconds a stopped run waits for its cancelled array tasks to end (SIGTERM, KillWait)


def execute_slurm(job: "ShardJob", tasks: list[Task], progress: "Progress", *, shared_fs: bool = False,
                  poll: float = POLL_SECONDS, name: str | None = None, tasks_per_array_task: int | None = None,
                  array_parallelism: int | None = None, partition: str | None = None, time: str | None = None,
                  cpus_per_task: int | None = None, mem: str | None = None, gpus: int | None = None,
                  gpu_flag: str | None = None, account: str | None = None, qos: str | None = None,
                  constraint: str | None = None, exclude: str | None = None, sbatch_args: Sequence[str] = (),
                  setup: Sequence[str] = (), container: str | None = None, container_mounts: Sequence[str] = (),
                  command: str | None = None, log_dir: str | None = None, retries: int | None = None,
                  signal_seconds: int | None = None) -> Iterator[TaskResult]:
    """Run `tasks` (the pending ones of the plan) as a Slurm job array; yields results as markers appear.

    The options are SlurmOptions' (docs/slurm.md); None keeps its default.
    """
    given = dict(name=name, tasks_per_array_task=tasks_per_array_task, array_parallelism=array_parallelism,
                 partition=partition, time=time, cpus_per_task=cpus_per_task, mem=mem, gpus=gpus,
                 gpu_flag=gpu_flag, account=account, qos=qos, constraint=constraint, exclude=exclude,
                 sbatch_args=tuple(sbatch_args), setup=tuple(setup), container=container,
                 container_mounts=tuple(container_mounts), command=command, log_dir=log_dir, retries=retries,
                 signal_seconds=signal_seconds)
    opts = from_job(job, prepare=False, shared_fs=shared_fs, **{k: v for k, v in given.items() if v is not None})
    if not tasks:
        return
    run_dir = job.rundir()
    for task_id in run_dir.failed_ids() & {t.id for t in tasks}:  # an earlier run's: read as this run's otherwise
        run_dir.remove_if_present(failed_file(task_id))
    submission = submit(opts, [t.id for t in tasks])
    print(f"shardflow: submitted {submission}", file=sys.stderr, flush=True)
    follower = _Follower(run_dir, {t.id for t in tasks}, submission, poll)
    settled = False  # finished, or Ctrl-C answered
    try:
        yield from follower.results(progress)
        settled = True
        # every task has its marker; the array tasks may still be exiting. The driver writes the report, so
        # the finalize job is not needed: cancel it, and return once the array has left the queue (a rerun
        # at once is then not refused as a second writer)
        queue.scancel([submission.finalize_id], wait=CANCEL_WAIT)
        _wait_gone([i for i in (submission.array_id,) if i], CANCEL_WAIT)
    except KeyboardInterrupt:
        settled = True
        _offer_cancel(submission)
        raise
    finally:
        if not settled:  # the driver stopped early (a user bug, on_error="raise"); it writes the report itself
            queue.scancel(submission.job_ids, wait=CANCEL_WAIT)


class _Follower:
    """Turns markers appearing in the run directory into TaskResults while the array runs."""

    def __init__(self, run_dir: RunDir, pending: set[int], submission: Submission, poll: float) -> None:
        self.run_dir, self.pending, self.submission, self.poll = run_dir, set(pending), submission, poll

    def results(self, progress: "Progress") -> Iterator[TaskResult]:
        array = [self.submission.array_id] if self.submission.array_id else []
        asked = float("-inf")
        while self.pending:
            ended = False
            if clock.monotonic() - asked >= min(QUEUE_SECONDS, 5 * self.poll):
                asked = clock.monotonic()
                ended = not queue.states(array)  # asked first: markers read after it are final when it has ended
            for result in self._new_results(final=ended):
                if result.status == "done":
                    progress.add_samples(result.stats.samples_in)
                yield result
            if ended and self.pending:
                for task_id in sorted(self.pending):
                    yield TaskResult.failed(task_id, f"the Slurm array {self.submission.array_id} ended without "
                                            f"finishing task {task_id} (scancel, time limit or node failure; see "
                                            "its log); rerun to resubmit it", FailureKind.IO)
                self.pending.clear()
            if self.pending:
                clock.sleep(self.poll)

    def _new_results(self, *, final: bool) -> Iterator[TaskResult]:
        for task_id in sorted(self.run_dir.done_ids() & self.pending):
            record = self.run_dir.read_done(task_id)
            self.pending.discard(task_id)
            yield TaskResult.from_marker(task_id, record)
        for task_id in sorted(self.run_dir.failed_ids() & self.pending):
            try:
                record = self.run_dir.read_json(failed_file(task_id))
            except FileNotFoundError:  # done meanwhile: the next poll sees its marker
                continue
            if record.get("kind") == FailureKind.IO and not final:
                continue  # the array task retries it in place (script.py): not the last word yet
            self.pending.discard(task_id)
            yield TaskResult.failed(task_id, record.get("error") or "failed", record.get("kind") or FailureKind.INPUT)


def _wait_gone(job_ids: list[str], timeout: float) -> None:
    deadline = clock.monotonic() + timeout
    while job_ids and queue.states(job_ids) and clock.monotonic() < deadline:
        clock.sleep(0.2)


def _offer_cancel(submission: Submission) -> None:
    """Ctrl-C: scancel what this run submitted; at a terminal, ask first (the jobs can run on unwatched)."""
    ids = submission.job_ids
    if sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty():
        try:
            answer = input(f"\nshardflow: scancel Slurm job(s) {', '.join(ids)}? [Y/n] ").strip().lower()
        except (EOFError, KeyboardInterrupt):
            answer = "y"
        if answer not in ("", "y", "yes"):
            print(f"shardflow: left running: {submission}; `shardflow status` follows it", file=sys.stderr)
            return
    queue.scancel(ids, wait=CANCEL_WAIT)
    print(f"shardflow: cancelled Slurm job(s) {', '.join(ids)}; run again to resume", file=sys.stderr)
