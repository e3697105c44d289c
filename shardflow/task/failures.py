"""The error policy of run_task, in one place: count, log and judge the samples a task loses.

`on_error="raise"` stops the task at the first bad sample; otherwise each one is logged (shard, key,
stage, reason) for errors/NNNNNN.jsonl, and the task fails only when too many samples failed
(`max_failure_rate`), naming the most common failure with an example key. A fatal exception
(errors.FATAL_ERRORS: the process is broken, not the sample) fails the task whatever the policy.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import traceback
from collections import Counter
from typing import Any

from shardflow.errors import RAISE, WARN, FailureKind, JobError, ShardflowError, StrayMember, fatal_error
from shardflow.rundir.stats import Stats
from shardflow.rundir.tracebacks import TRACES_PER_DIGEST, format_trace, trace_digest
from shardflow.storage.paths import is_local, local_path
from shardflow.text import redact_userinfo, safe, safe_repr, truncate

# Failures a task must have met before it is stopped mid-stream on its failure rate (check_rate).
EARLY_ABORT_FAILURES = 10


class TaskFailed(Exception):
    """Ends a task's attempt with a recorded failure of `kind` (not retried as I/O trouble is)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class SampleFailures:
    """The lost samples of one task: counted in `stats`, listed in `errors`, judged by the policy."""

    def __init__(self, task_id: int, stats: Stats, on_error: str, max_failure_rate: float, *,
                 debug: bool = False) -> None:
        self.task_id = task_id
        self.stats = stats
        self.on_error = on_error
        self.max_failure_rate = max_failure_rate
        self.debug = debug  # --debug: the first failure raises the original exception, traceback intact
        self.errors: list[dict[str, Any]] = []
        self.traces: Counter = Counter()  # digest -> full tracebacks kept so far
        self.last_error: BaseException | None = None  # for where a repeated bug is (user_bug)
        # the samples that failed, each once: a sample can fail more than once (each output of a 1:N fn,
        # a split key's report and its leaving out), and the rate is of samples, not of failures
        self._failed_keys: set[tuple[str, str]] = set()
        self._failed_unkeyed = 0  # failures that name no key (a member before any key), each a sample
        self._strays_told: set[str] = set()  # shards whose first stray member was warned about (left_out)

    def record(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Log a failed sample; raise instead when the policy says to stop, or when the error is fatal
        (FATAL_ERRORS: the task fails whatever the policy, see fatal_error)."""
        if type(error) is StrayMember:  # a member of no sample: logged, not a failed sample (left_out)
            self.left_out(error, url, key, where)
            return
        if self.debug:
            raise error
        fatal = fatal_error(error)
        if fatal is not None:
            self.note(error, url, key, where)
            kind = FailureKind.USER if self.on_error == RAISE else FailureKind.INPUT
            raise TaskFailed(f"shard {safe(redact_userinfo(url))}, key {safe_repr(key)}, {where}: "
                             f"{type(fatal).__name__}: {safe(str(fatal), 500)} (fatal: this process is broken, "
                             f"not the sample; the task fails whatever on_error says and runs again on the next "
                             f"run)", kind) from error
        self.stats.failed += 1
        if key is None:
            self._failed_unkeyed += 1
        else:
            self._failed_keys.add((url, key))
        self.stats.fail_reasons[type(error).__name__] += 1
        self.note(error, url, key, where)
        self.last_error = error
        if self.on_error == RAISE:
            kind = FailureKind.INPUT if isinstance(error, ShardflowError) else FailureKind.USER
            reason = self.errors[-1]["reason"]
            raise TaskFailed(f"shard {safe(redact_userinfo(url))}, key {safe_repr(key)}, {where}: {safe(reason, 2000)}",
                             kind) from error
        if self.on_error == WARN:
            reason = self.errors[-1]["reason"]
            print(f"shardflow: skipped shard {safe(redact_userinfo(url))}, key {safe_repr(key)} ({where}): "
                  f"{safe(reason, 2000)}", file=sys.stderr)
        self.check_rate()

    def left_out(self, error: StrayMember, url: str, key: str | None, where: str) -> None:
        """A member that belongs to no sample (no extension, a hidden or macOS `._*` file): one line in
        errors/ and, for the first of each shard, one on stderr; never a failed sample, whatever the
        policy (its neighbours are whole). Not counted in Stats: a count there would be a new field in
        every summary, status and report, for members that are no data; errors/ lists each one and
        `status` counts them by kind (read StrayMember)."""
        self.note(error, url, key, where)
        if url not in self._strays_told:
            self._strays_told.add(url)
            print(f"shardflow: warning: {error} (further members of this shard that belong to "
                  "no sample are left out too, each listed in errors/)", file=sys.stderr)

    def job_bug(self, error: BaseException, url: str, key: str | None, what: str) -> TaskFailed:
        """The failure for a broken contract of the job's output as a whole (a batch's result, not one
        sample's): logged in errors/ at stage `process`, and a TaskFailed of kind `user` for the caller
        to raise, whatever on_error says: no sample is at fault, so skipping samples cannot help, and
        the same job fails the same way on every task (the run stops). --debug raises `error` itself."""
        if self.debug:
            raise error
        self.note(error, url, key, "process")
        reason = self.errors[-1]["reason"]
        return TaskFailed(f"shard {safe(redact_userinfo(url))}, key {safe_repr(key)}, {what}: {safe(reason, 2000)}; "
                          "a bug in the job, not bad input: the run stops (fix it and rerun)", FailureKind.USER)

    def note(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Add a line to the task's error log (errors/<task>.jsonl), without counting a failed sample."""
        reason = error.reason if isinstance(error, ShardflowError) else f"{type(error).__name__}: {error}"
        digest = trace_digest(error, reason)
        # no traceback at all for an error whose reason says all there is (`hide_traceback`: a shell command's
        # failure names the command, its status and its stderr; its frames are shardflow's own)
        hidden = bool(getattr(error, "hide_traceback", False))
        # the key and reason may hold a 5 MB name: cut (text.truncate); JSON escapes the rest
        record = {"task": self.task_id, "shard": redact_userinfo(url), "key": None if key is None else truncate(key),
                  "stage": where, "type": type(error).__name__, "reason": truncate(redact_userinfo(reason), 2000),
                  "traceback": None if hidden else digest}
        if not hidden and self.traces[digest] < TRACES_PER_DIGEST:  # the full text of the first few of each
            self.traces[digest] += 1
            record["trace"] = redact_userinfo(format_trace(error))
        self.errors.append(record)

    def check_rate(self, final: bool = False) -> None:
        """Fail the task when its failed samples are more than max_failure_rate of those it read.

        Samples are counted once however often they failed (`failed_samples`). At the end (`final`)
        the whole count is known and the rate is the rule as stated, however few failed (1 of 1 with
        the default 0.5 fails; 4 of 8 does not). While streaming, the task is
        stopped early only once 10 have failed: without that floor the first sample's failure (1 of 1)
        would end a task that the rest of its samples would have kept under the rate."""
        stats, rate = self.stats, self.max_failure_rate
        failed = self.failed_samples
        least = 1 if final else EARLY_ABORT_FAILURES
        if failed >= least and failed > rate * stats.samples_in:
            bug = user_bug(self.errors, stats, self.last_error)
            if bug is not None:  # not bad input: the same bug will fail every task, so the run stops
                raise TaskFailed(bug, FailureKind.USER)
            # a sample can fail more than once (each output of a 1:N fn, a split key's parts): never "2 of 1"
            counted = (f"{failed} of {stats.samples_in} samples failed"
                       if stats.failed == failed <= stats.samples_in else
                       f"{stats.failed} sample failures in {stats.samples_in} "
                       f"sample{'' if stats.samples_in == 1 else 's'} read ({failed} failed)")
            raise TaskFailed(
                f"{counted} (more than max_failure_rate={rate}); "
                f"{self.most_common_error()}; every one is listed in errors/ in the run directory",
                FailureKind.INPUT,
            )

    @property
    def failed_samples(self) -> int:
        """How many samples failed, each counted once however often it failed (stats.failed counts failures)."""
        return len(self._failed_keys) + self._failed_unkeyed

    def most_common_error(self) -> str:
        """'most often at decode: DecodeError (12x), e.g. key 'a/17': ...' for failure messages."""
        counts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for error in failures_only(self.errors):
            counts.setdefault((error["stage"], error["type"]), []).append(error)
        if not counts:
            return "no sample errors recorded"
        (stage, kind), errors = max(counts.items(), key=lambda item: len(item[1]))
        first = errors[0]
        return (f"most often at {stage}: {kind} ({len(errors)}x), e.g. key {safe_repr(first['key'])}: "
                f"{safe(first['reason'], 2000)}")


def encode_stage(error: BaseException) -> str:
    """The stage an encoder's failure is logged at: `process` for a JobError (an output the job made that
    no encoder can take, as a non-str entry name: the job's bug, judged by user_bug like its other broken
    outputs), `encode` for a value that would not encode."""
    return "process" if isinstance(error, JobError) else "encode"


def missing_input(url: str, error: BaseException) -> TaskFailed:
    """The failure of a planned input that is not there: `input` (restore it) when its folder exists on
    this machine, `io` (retry on another worker or pod) when the folder itself is missing here, as on a
    worker that lacks the shared filesystem the input lives on."""
    if is_local(url):
        folder = os.path.dirname(local_path(url)) or "."
        if not os.path.isdir(folder):
            return TaskFailed(f"input shard {safe(url)} not visible on this machine ({socket.gethostname()}): "
                              f"no folder {safe(folder)} here; is the filesystem mounted on every worker? "
                              f"({safe(error)})", FailureKind.IO)
    return TaskFailed(f"input shard missing: {error} (it was planned; restore it, or plan again without it using "
                      "--redo)", FailureKind.INPUT)


def user_bug(errors: list[dict[str, Any]], stats: Stats, last: BaseException | None = None) -> str | None:
    """A message when every sample read so far failed in process() with the same exception raised at the same
    place (one traceback digest): a broken process(), fatal for the run, not bad input; else None.

    A sample may fail more than once (each output of a 1:N fn): the samples are counted by (shard, key),
    so the message says "5 of 5", never "9 of 5"."""
    errors = failures_only(errors)
    if not errors or stats.failed != len(errors):
        return None
    # an error shardflow made and reported without raising it (an output check's JobError) has no frames: its
    # digest is of its reason (rundir.tracebacks.trace_digest), which names samples; one type is one check
    unraised = last is not None and last.__traceback__ is None
    same = {e["type"] if unraised else (e["type"], e["traceback"]) for e in errors}
    if {e["stage"] for e in errors} != {"process"} or len(same) != 1:
        return None
    samples = len({(e["shard"], e["key"]) for e in errors})
    if samples < stats.samples_in:
        return None
    first = errors[0]
    explain = getattr(last, "every_sample_failed", None)  # an error that words this itself (CommandFailed)
    if callable(explain):
        return str(explain(first, samples, stats.samples_in))
    # a JobError shardflow raised checking fn's outputs (a key produced twice, a non-str entry name) was
    # raised in shardflow's frames, not at the bug: no "at" then, and it says the outputs were refused
    checked = isinstance(last, JobError)
    where = _user_frame(last, fallback=not checked)
    what = (f"process() raised the same {first['type']}" if where or not checked else
            f"the outputs of process() were refused with the same {first['type']}")
    return (f"{what} on every sample ({samples} of {stats.samples_in})"
            f"{f' at {where}' if where else ''}, e.g. shard {safe(first['shard'])}, key {first['key']!r}: "
            f"{safe(first['reason'])}; "
            "a bug in the job, not bad input: the run stops (fix it and rerun; every sample is in errors/)")


def failures_only(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of `errors` that are failures: without the members that belong to no sample
    (StrayMember, logged by SampleFailures.left_out), which fail nothing."""
    return [e for e in errors if e["type"] != _STRAY]


_STRAY = StrayMember.__name__


def _user_frame(error: BaseException | None, fallback: bool = True) -> str | None:
    """'file.py, line N, in fn' of the innermost frame outside shardflow and the installed libraries
    (when there is none: with `fallback`, the innermost frame of all, as a built-in job's bug is in
    shardflow; without it None)."""
    if error is None or error.__traceback__ is None:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../shardflow
    libraries = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith((package + os.sep, *libraries))]
    frame = (mine or (frames if fallback else []) or [None])[-1]
    return None if frame is None else f"{frame.filename}, line {frame.lineno}, in {frame.name}"

