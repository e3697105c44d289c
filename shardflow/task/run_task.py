"""run_task: the one function every backend executes for one task.

    open input (fsspec stream) -> tar members -> samples -> decode -> fn(sample)
    -> encode -> ShardWriter (atomic per shard) -> error log, stats -> completion marker LAST

It is idempotent: a task whose marker exists is skipped; an unfinished one starts again from a
clean state (stale temp files of the task removed, on S3 the multipart uploads a killed attempt
left open for its keys aborted: storage.stale_uploads; shards rewritten with identical bytes).
"""

from __future__ import annotations

import time
import traceback
from itertools import islice
from typing import Any, Callable, Protocol

from shardflow.errors import (
    RAISE,
    SKIP,
    FailureKind,
    FormatError,
    JobError,
    PipeNotAllowed,
    SampleError,
    ShardflowError,
    ShardIOError,
)
from shardflow.rundir.records import TaskClock
from shardflow.rundir.stats import Stats
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.shards.task_files import existing_parts, remove_parts_after, remove_stale_temps
from shardflow.shards.writer import ShardInfo, ShardWriter
from shardflow.storage.counting import CountingReader
from shardflow.storage.schemes import open_read
from shardflow.storage.stale_uploads import abort_own_uploads
from shardflow.task.batch import BatchProcessor, make_processor
from shardflow.task.context import TaskContext, _running
from shardflow.task.failures import SampleFailures, TaskFailed, missing_input
from shardflow.task.process import SampleProcessor, refused_output
from shardflow.task.seeds import job_seed
from shardflow.task.split_keys import check_split_keys, read_samples, without_split_keys  # split keys held back

Progress = Callable[[int], None]
_PROGRESS_EVERY_S = 0.5


class MakesContext(Protocol):
    """What run_task accepts besides a TaskContext: a job that makes one (ShardJob, above this layer)."""

    def task_context(self) -> TaskContext: ...


_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


def run_task(task: Task, job: TaskContext | MakesContext, *, progress: Progress | None = None) -> TaskResult:
    """Run one task to completion (or a recorded failure). Never raises for bad data.

    `job` is a ShardJob or the TaskContext it made (`job.task_context()`), which is all this reads.
    """
    context: TaskContext = job if isinstance(job, TaskContext) else job.task_context()
    token = _running.set(context.spec)
    try:
        return _run(task, context, progress)
    finally:
        _running.reset(token)


def _run(task: Task, context: TaskContext, progress: Progress | None) -> TaskResult:
    """run_task's body: skip a done task, else attempt it, retrying I/O errors with backoff."""
    run_dir = context.run_dir
    if run_dir.is_done(task.id):
        return TaskResult.from_marker(task.id, run_dir.read_done(task.id), "skipped")
    clock = TaskClock(run_dir, task.id)  # running/ entry now; records/ name at the end (rundir.records)
    try:
        result = _attempts(task, context, progress, clock)
    finally:
        clock.ended()
    if result.status == "failed":
        clock.write_failed(result.kind)
    return result


def _attempts(task: Task, context: TaskContext, progress: Progress | None, clock: TaskClock) -> TaskResult:
    """Attempt the task, retrying I/O errors with backoff; a failure recorded in failed/."""
    if context.spec.debug:  # no retries, nothing caught: the user's exception reaches the caller (and pdb)
        with job_seed(context.spec.seed):
            return without_split_keys(lambda: _attempt(task, context, progress, clock),
                                      context.options_for(task.output))
    attempt = 0
    while True:
        attempt += 1
        clock.attempts = attempt
        counted = _Counted(progress)  # an attempt that is retried takes its samples back off the progress
        try:
            with job_seed(context.spec.seed):
                told = counted if progress is not None else None
                result = without_split_keys(lambda: _attempt(task, context, told, clock),  # noqa: B023 - called here
                                            context.options_for(task.output), counted.take_back)
        except TaskFailed as exc:
            return _record_failure(task, context, str(exc), exc.kind, attempt)
        except (ShardIOError, OSError) as exc:
            if attempt <= context.spec.io_retries:
                counted.take_back()  # the retry reads them again: counted once ("1049/~1049" otherwise)
                time.sleep(min(context.spec.retry_backoff * 2 ** (attempt - 1), 30.0))
                continue
            reason = str(exc) if isinstance(exc, ShardflowError) else f"{type(exc).__name__}: {exc}"
            return _record_failure(task, context, f"I/O error after {attempt} attempts: {reason}", FailureKind.IO,
                                   attempt)
        except Exception as exc:  # noqa: BLE001 - a bug must fail this task visibly, not kill the run
            where = traceback.format_exc(limit=-3).strip().replace("\n", " | ")
            return _record_failure(task, context, f"unexpected {type(exc).__name__}: {exc} [{where}]",
                                   FailureKind.INPUT, attempt)
        result.attempts = attempt
        return result


def _record_failure(task: Task, context: TaskContext, error: str, kind: str, attempt: int) -> TaskResult:
    """The failure record, naming the task's shards that exist under final names: rollover parts it
    committed before it failed (or an earlier run's). They are not deleted here: a second attempt of the
    same task running elsewhere (a duplicate pod) may have committed them and be about to finish; the
    task's next run replaces them. Without the note they were in the folder with nothing saying so."""
    try:
        left = existing_parts(task.part_url, context.options_for(task.output))
    except Exception:  # noqa: BLE001 - the store that failed the task may fail this look too: the error counts
        left = []
    if left:
        names = ", ".join(url.rsplit("/", 1)[-1] for url in left[:3]) + (", ..." if len(left) > 3 else "")
        error += (f"; {len(left)} of its output shards exist ({names}), written before it failed or by an "
                  "earlier run: not this run's output, they are replaced when the task runs again")
    return context.run_dir.record_failure(task, error, kind, attempts=attempt)


def _attempt(task: Task, context: TaskContext, progress: Progress | None, clock: TaskClock) -> TaskResult:
    """One try at the task: stream it, then write its error log and, LAST, its completion marker."""
    started = time.perf_counter()
    stats = Stats()
    spec = context.spec
    failures = SampleFailures(task.id, stats, spec.on_error, spec.max_failure_rate, debug=spec.debug)
    try:
        infos = _stream_task(task, context, _processor(context, stats, failures), progress, clock)
    except TaskFailed:
        context.run_dir.write_errors(task.id, failures.errors)
        raise
    check_split_keys(infos)  # met a split key under skip: the task runs again without it (task/split_keys)
    stats.shards_out = len(infos)
    stats.bytes_out = sum(i.nbytes for i in infos)
    stats.seconds = time.perf_counter() - started
    outputs = [i.to_json() for i in infos]
    context.run_dir.write_errors(task.id, failures.errors)
    record = clock.write_done(stats)  # the listing-readable record, just before the marker
    context.run_dir.mark_done(task.id, {"task": task.id, "inputs": list(task.inputs), "outputs": outputs,
                                        "stats": stats.to_json(), "record": record})
    return TaskResult(task.id, "done", stats, outputs)


class _Counted:
    """The progress callback of one attempt, remembering how many samples it reported."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.reported = 0

    def __call__(self, count: int) -> None:
        self.reported += count
        if self.callback is not None:
            self.callback(count)

    def take_back(self) -> None:
        if self.callback is not None and self.reported:
            self.callback(-self.reported)
        self.reported = 0


class _ProgressBatcher:
    """Hands sample counts to the backend's progress callback at most every half second."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.pending = 0
        self.last = time.perf_counter()

    def add(self, count: int = 1) -> None:
        self.pending += count
        if self.callback is not None and time.perf_counter() - self.last > _PROGRESS_EVERY_S:
            self.flush()
            self.last = time.perf_counter()

    def flush(self) -> None:
        if self.callback is not None and self.pending:
            self.callback(self.pending)
        self.pending = 0


def _processor(context: TaskContext, stats: Stats, failures: SampleFailures) -> SampleProcessor | BatchProcessor:
    """The task's processor; a job whose setup or device fails on this worker fails the task once, clearly."""
    try:
        return make_processor(context, stats, failures)
    except JobError as exc:  # SetupError, no CUDA: the same on every task of this worker, so stop the run
        raise TaskFailed(str(exc), FailureKind.USER) from exc


def _stream_task(task: Task, context: TaskContext, processor: SampleProcessor | BatchProcessor,
                 progress: Progress | None, clock: TaskClock | None = None) -> list[ShardInfo]:
    """Stream every input of the task through the processor into the task's output shards."""
    tag = context.temp_tag(task)
    out_options = context.options_for(task.output)
    remove_stale_temps(task.part_url, out_options, tag=tag)  # by name: no listing
    # object stores: a killed attempt's open multipart uploads of these keys (one listing per process)
    abort_own_uploads(task.output, task.output_parts, out_options, scope=context.run_dir_url)
    counter = _ProgressBatcher(progress)
    writer = ShardWriter(task.part_url, maxcount=context.spec.rollover[0], maxsize=context.spec.rollover[1],
                         storage_options=out_options, temp_tag=tag, checksum=context.spec.checksum or "sha256")
    if clock is not None:  # the counters its beats report while it runs (rundir.beats)
        clock.follow(processor.stats, writer)
    try:
        with writer:
            for url in task.inputs:
                _stream_input(url, context, processor, writer, counter, clock)
            processor.failures.check_rate(final=True)
            infos: list[ShardInfo] = writer.close()
        # before the marker: a redone task's parts beyond this run's count are an earlier run's (a kill
        # here leaves the task not done, and its next attempt deletes them again)
        remove_parts_after(task.part_url, len(infos), out_options)
    except BaseException:
        _drop_temps(task, out_options, tag)
        raise
    counter.flush()
    return infos


def _drop_temps(task: Task, out_options: dict[str, Any] | None, tag: str) -> None:
    """Remove the task's temps by name after it stopped on an exception.

    The writer's abort removes them as a rule; this covers an exception raised asynchronously (a
    worker's SIGTERM handler) after a temp was created but before a writer owned it, whose temp only a
    garbage collection would otherwise remove (never, when the process exits first). Best effort: the
    task's next attempt removes the same names before it starts.
    """
    try:
        remove_stale_temps(task.part_url, out_options, tag=tag)
    except Exception:  # noqa: BLE001 - must not replace the error that stopped the task
        pass


def _stream_input(url: str, context: TaskContext, processor: SampleProcessor | BatchProcessor, writer: ShardWriter,
                  counter: _ProgressBatcher, clock: TaskClock | None = None) -> None:
    """One input shard of a task: its samples processed and written, its bytes counted."""
    stats, failures = processor.stats, processor.failures
    stream = _open_input(url, context, failures)
    counted = CountingReader(stream)
    if clock is not None:  # its bytes in the task's beats (rundir.beats) before the input ends
        clock.reading(counted)
    policy = RAISE if context.spec.on_error == RAISE else SKIP  # read_samples reports; failures warns itself

    def report(error: ShardflowError) -> None:
        failures.record(error, error.url or url, error.key, "read")

    samples = read_samples(counted, url, on_error=policy, report=report)
    arrange = getattr(context.fn, "arrange_samples", None)  # the fn's stream stage: sort, commands run ahead
    batched = isinstance(processor, BatchProcessor)
    try:
        if batched:  # fn over batches; read and write run in threads beside it (task/batch.py)
            processor.write_all(lambda rep: islice(read_samples(counted, url, on_error=policy, report=rep),
                                                   context.spec.limit), url, writer, counter.add)
        overlapped = not batched and processor.overlaps()
        if overlapped:  # a decoding job: read + decode | fn | encode + write in threads (task/process.py)
            left = None if context.spec.limit is None else context.spec.limit - stats.samples_in
            processor.write_all(lambda rep: read_samples(counted, url, on_error=policy, report=rep), url, writer,
                                counter.add, limit=left)
        for sample in () if batched or overlapped else arrange(samples) if arrange is not None else samples:
            if context.spec.limit is not None and stats.samples_in >= context.spec.limit:
                break  # a trial run (--limit): the task ends after its first samples
            stats.samples_in += 1
            for encoded in processor.process(sample):
                try:
                    writer.write(encoded)
                except SampleError as exc:  # the writer refused this output, writing nothing (task/process.py)
                    failures.record(refused_output(exc, url, sample["__key__"]), url, sample["__key__"], "process")
                    continue
                stats.samples_out += 1
            counter.add()
            sample = encoded = None  # let go before the next is read: a large sample is freed first (28.6)
    except (FormatError, SampleError) as exc:
        failures.note(exc, exc.url or url, exc.key, "read")  # errors/ names where it broke
        raise TaskFailed(str(exc), FailureKind.INPUT) from exc
    finally:
        stream.close()
    stats.shards_in += 1
    stats.bytes_in += counted.nbytes


def _open_input(url: str, context: TaskContext, failures: SampleFailures) -> Any:
    try:
        return open_read(url, context.options_for(url), allow_pipe=context.spec.allow_pipe)
    except PipeNotAllowed as exc:  # a setting, the same for every task: no retry, the run stops (kind user)
        failures.note(exc, url, None, "open")
        raise TaskFailed(str(exc), FailureKind.USER) from exc
    except ShardIOError as exc:
        if isinstance(exc.__cause__, _MISSING):
            failures.note(exc, url, None, "open")
            # retrying cannot bring it back: fail now, without the backoff of I/O retries (unless this
            # machine does not see the input's folder at all: then another worker may, kind io)
            raise missing_input(url, exc) from exc
        raise
