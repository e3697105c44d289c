"""run_task: the one function every backend executes for one task.

    open input (fsspec stream) -> tar members -> samples -> decode -> fn(sample)
    -> encode -> ShardWriter (atomic per shard) -> error log, stats -> completion marker LAST

It is idempotent: a task whose marker exists is skipped; an unfinished one starts again from a
clean state (stale temp files of the task removed, shards rewritten with identical bytes).
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import urls
from .errors import FormatError, JobError, SampleError, ShardflowError, ShardIOError, SkipSample
from .samples import Sample, check_key, read_samples
from .stats import Stats
from .writer import ShardInfo, ShardWriter, remove_stale_temps

if TYPE_CHECKING:
    from .job import ShardJob

# Failure kinds: how a backend should react (Kubernetes exit codes map onto these).
INPUT = "input"  # bad input or a broken job function: retrying gives the same result
IO = "io"  # storage/network trouble that outlived the retries: worth retrying later
USER = "user"  # the job function raised and the policy is on_error="raise"


@dataclass(frozen=True)
class Task:
    """A unit of work: a few input shards, and where its output parts go.

    `output` is the URL of part 0; `output_parts` is a format string with a `{part}` field for the
    parts a task rolls over into (maxcount/maxsize).
    """

    id: int
    inputs: tuple[str, ...]
    output: str
    output_parts: str

    def part_url(self, part: int) -> str:
        return self.output if part == 0 else self.output_parts.format(part=part)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "inputs": list(self.inputs), "output": self.output, "output_parts": self.output_parts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Task":
        return cls(int(data["id"]), tuple(data["inputs"]), data["output"], data["output_parts"])


@dataclass
class TaskResult:
    """What happened to one task; small and picklable so it crosses process/cluster boundaries."""

    task_id: int
    status: str  # "done" | "skipped" (finished by an earlier run) | "failed"
    stats: Stats = field(default_factory=Stats)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    kind: str | None = None  # failure kind: INPUT | IO | USER
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status != "failed"


class _TaskFailed(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class _CountingReader:
    """Counts the bytes read from a shard stream (bytes_in)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.count += len(data)
        return data


# -- deterministic randomness ------------------------------------------------------------------
_job_seed = 0


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from the parts' text, identical on every machine and Python version."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_seed(sample: Sample) -> int:
    """The seed of this sample in the running job: derived from (job seed, sample key)."""
    return stable_seed(_job_seed, sample["__key__"])


def sample_rng(sample: Sample, kind: str = "numpy") -> Any:
    """A random generator for this sample: same key and job seed, same numbers, on any worker.

    kind: "numpy" (np.random.Generator), "python" (random.Random) or "torch" (torch.Generator).
    """
    seed = sample_seed(sample)
    if kind == "numpy":
        return np.random.default_rng(seed)
    if kind == "python":
        return random.Random(seed)
    if kind == "torch":
        import torch

        return torch.Generator().manual_seed(seed)
    raise ValueError(f"kind must be numpy, python or torch, not {kind!r}")


def _seed_globals(seed: int) -> None:
    """Seed the global generators too, so code that calls random/np.random/torch is reproducible."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        # not torch.manual_seed: with CUDA not yet initialised it queues a lazy seeding call together
        # with a formatted stack trace (traceback + linecache stats), a few ms per sample
        torch.random.default_generator.manual_seed(seed)
        cuda = sys.modules.get("torch.cuda")
        if cuda is not None and cuda.is_initialized():
            cuda.manual_seed_all(seed)


# -- the task ------------------------------------------------------------------------------------
def run_task(task: Task, job: "ShardJob", *, progress: Callable[[int], None] | None = None) -> TaskResult:
    """Run one task to completion (or a recorded failure). Never raises for bad data."""
    run_dir = job.rundir()
    if run_dir.is_done(task.id):
        record = run_dir.read_done(task.id)
        return TaskResult(task.id, "skipped", Stats.from_json(record["stats"]), record["outputs"])
    attempt = 0
    while True:
        attempt += 1
        try:
            result = _attempt(task, job, progress)
        except _TaskFailed as exc:
            return _record_failure(task, job, str(exc), exc.kind, attempt)
        except (ShardIOError, OSError) as exc:
            if attempt <= job.io_retries:
                time.sleep(min(job.retry_backoff * 2 ** (attempt - 1), 30.0))
                continue
            reason = str(exc) if isinstance(exc, ShardflowError) else f"{type(exc).__name__}: {exc}"
            return _record_failure(task, job, f"I/O error after {attempt} attempts: {reason}", IO, attempt)
        except Exception as exc:  # noqa: BLE001 - a bug must fail this task visibly, not kill the run
            where = traceback.format_exc(limit=-3).strip().replace("\n", " | ")
            return _record_failure(task, job, f"unexpected {type(exc).__name__}: {exc} [{where}]", INPUT, attempt)
        result.attempts = attempt
        return result


def _record_failure(task: Task, job: "ShardJob", message: str, kind: str, attempts: int) -> TaskResult:
    job.rundir().mark_failed(task.id, {"task": task.id, "error": message, "kind": kind, "inputs": list(task.inputs)})
    return TaskResult(task.id, "failed", error=message, kind=kind, attempts=attempts)


class _SampleProcessor:
    """Per-sample steps of a task with the job's error policy applied to each."""

    def __init__(self, task: Task, job: "ShardJob", stats: Stats) -> None:
        self.task = task
        self.job = job
        self.stats = stats
        self.errors: list[dict[str, Any]] = []
        self.decoder = job.make_decoder()
        self.encoder = job.make_encoder()
        self.produced_by: dict[str, str] = {}  # output key -> input key, to name both on a clash

    def record(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Log a failed sample; raise instead when the policy says to stop."""
        self.stats.failed += 1
        self.stats.fail_reasons[type(error).__name__] += 1
        self.note(error, url, key, where)
        if self.job.on_error == "raise":
            kind = INPUT if isinstance(error, ShardflowError) else USER
            reason = self.errors[-1]["reason"]
            raise _TaskFailed(f"shard {url}, key {key!r}, {where}: {reason}", kind) from error
        if self.job.on_error == "warn":
            print(f"shardflow: skipped shard {url}, key {key!r} ({where}): {self.errors[-1]['reason']}", file=sys.stderr)
        self.check_rate()

    def note(self, error: BaseException, url: str, key: str | None, where: str) -> None:
        """Add a line to the task's error log (errors/<task>.jsonl), without counting a failed sample."""
        reason = error.reason if isinstance(error, ShardflowError) else f"{type(error).__name__}: {error}"
        frames = traceback.extract_tb(error.__traceback__)
        digest = hashlib.sha1("|".join(f"{f.filename}:{f.lineno}:{f.name}" for f in frames).encode()).hexdigest()[:12]
        self.errors.append({
            "task": self.task.id, "shard": url, "key": key, "stage": where, "type": type(error).__name__,
            "reason": reason, "traceback": digest,
        })

    def check_rate(self, final: bool = False) -> None:
        """Fail the task when too many samples failed: while streaming once 10 have failed and they are
        more than max_failure_rate of those read so far; at the end, over the whole task."""
        stats, rate = self.stats, self.job.max_failure_rate
        least = min(10, stats.samples_in) if final else 10
        if stats.failed and stats.failed >= least and stats.failed > rate * stats.samples_in:
            raise _TaskFailed(
                f"{stats.failed} of {stats.samples_in} samples failed (more than max_failure_rate={rate}); "
                f"{self.most_common_error()}; every one is listed in errors/ in the run directory",
                INPUT,
            )

    def most_common_error(self) -> str:
        """'most often: decode DecodeError (12x), e.g. key 'a/17': cannot decode ...' for failure messages."""
        counts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for error in self.errors:
            counts.setdefault((error["stage"], error["type"]), []).append(error)
        if not counts:
            return "no sample errors recorded"
        (stage, kind), errors = max(counts.items(), key=lambda item: len(item[1]))
        first = errors[0]
        return f"most often at {stage}: {kind} ({len(errors)}x), e.g. key {first['key']!r}: {first['reason']}"

    def process(self, sample: Sample) -> list[Sample]:
        """Decode, call fn and encode one input sample; returns encoded outputs (maybe none)."""
        url, key = sample["__url__"], sample["__key__"]
        try:
            decoded = self.decoder(sample) if self.decoder is not None else sample
        except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's problem
            self.record(exc, url, key, "decode")
            return []
        seed = stable_seed(_job_seed, key)
        _seed_globals(seed)
        try:
            outputs = _as_outputs(self.job.fn(decoded), key)
        except SkipSample as skip:
            self.stats.skipped += 1
            self.stats.skip_reasons[skip.reason] += 1
            return []
        except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
            self.record(exc, url, key, "process")
            return []
        if not outputs:
            self.stats.dropped += 1
            return []
        raw = _unchanged_values(sample, decoded)
        encoded = []
        for out in outputs:
            out_key = out["__key__"]
            why = check_key(out_key)
            if why is None and out_key in self.produced_by:
                why = f"output key {out_key!r} produced twice (by input samples {self.produced_by[out_key]!r} and {key!r})"
            if why is not None:
                self.record(JobError(why, url=url, key=key), url, key, "process")
                continue
            try:
                encoded.append(self.encoder(_reuse_raw(out, raw)))
            except Exception as exc:  # noqa: BLE001
                self.record(exc, url, key, "encode")
                continue
            self.produced_by[out_key] = key
        return encoded


def _unchanged_values(raw: Sample, decoded: Sample) -> dict[int, tuple[str, bytes]]:
    """id(decoded value) -> (ext, original bytes), for values the job may pass through untouched."""
    if decoded is raw:
        return {}
    return {id(decoded[ext]): (ext, data) for ext, data in raw.items()
            if not ext.startswith("__") and ext in decoded and decoded[ext] is not data}


def _reuse_raw(out: Sample, raw: dict[int, tuple[str, bytes]]) -> Sample:
    """Write the input's own bytes for values fn returned unchanged under the same extension.

    Re-encoding an untouched JPEG would lose quality and time; the original bytes are exact.
    """
    if not raw:
        return out
    swaps = {ext: raw[id(v)][1] for ext, v in out.items() if id(v) in raw and raw[id(v)][0] == ext}
    return {**out, **swaps} if swaps else out


def _as_outputs(result: Any, key: str) -> list[Sample]:
    """Normalise fn's return value: dict (1:1), None (dropped) or an iterable of dicts (1:N)."""
    if result is None:
        return []
    if isinstance(result, dict):
        out = result if "__key__" in result else {**result, "__key__": key}
        return [out]
    if isinstance(result, (list, tuple, types.GeneratorType)) or hasattr(result, "__next__"):
        outs = []
        for i, item in enumerate(result):
            if not isinstance(item, dict):
                raise JobError(f"fn yielded {type(item).__name__}; expected dicts")
            outs.append(item if "__key__" in item else {**item, "__key__": f"{key}_{i}"})
        return outs
    raise JobError(f"fn returned {type(result).__name__}; expected a dict, None, or an iterable of dicts")


def _attempt(task: Task, job: "ShardJob", progress: Callable[[int], None] | None) -> TaskResult:
    global _job_seed
    _job_seed = job.seed
    started = time.perf_counter()
    stats = Stats()
    processor = _SampleProcessor(task, job, stats)
    try:
        infos = _stream_task(task, job, processor, stats, progress)
    except _TaskFailed:
        job.rundir().write_errors(task.id, processor.errors)
        raise
    stats.shards_out = len(infos)
    stats.bytes_out = sum(i.nbytes for i in infos)
    stats.seconds = time.perf_counter() - started
    outputs = [i.to_json() for i in infos]
    run_dir = job.rundir()
    run_dir.write_errors(task.id, processor.errors)
    run_dir.mark_done(task.id, {"task": task.id, "inputs": list(task.inputs), "outputs": outputs, "stats": stats.to_json()})
    return TaskResult(task.id, "done", stats, outputs)


def _stream_task(
    task: Task, job: "ShardJob", processor: _SampleProcessor, stats: Stats, progress: Callable[[int], None] | None
) -> list[ShardInfo]:
    """Stream every input of the task through the processor into the task's output shards."""
    out_options = job.options_for(task.output)
    tag = job.temp_tag(task)
    remove_stale_temps(task.output, out_options, tag=tag)
    policy = "raise" if job.on_error == "raise" else "skip"
    pending_progress, last_report = 0, time.perf_counter()
    writer = ShardWriter(
        task.part_url, maxcount=job.maxcount, maxsize=job.maxsize, storage_options=out_options, temp_tag=tag
    )
    with writer:
        for url in task.inputs:
            try:
                stream = urls.open_read(url, job.options_for(url), allow_pipe=job.allow_pipe)
            except ShardIOError as exc:
                if isinstance(exc.__cause__, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                    processor.note(exc, url, None, "open")
                    # retrying cannot bring it back: fail now, without the backoff of I/O retries
                    raise _TaskFailed(f"input shard missing: {exc} (it was planned; restore it, or plan "
                                      "again without it using --force)", INPUT) from exc
                raise
            counted = _CountingReader(stream)
            try:
                def report(error: ShardflowError, url: str = url) -> None:
                    processor.record(error, error.url or url, error.key, "read")

                try:
                    for sample in read_samples(counted, url, on_error=policy, report=report):
                        stats.samples_in += 1
                        for encoded in processor.process(sample):
                            writer.write(encoded)
                            stats.samples_out += 1
                        pending_progress += 1
                        if progress is not None and time.perf_counter() - last_report > 0.5:
                            progress(pending_progress)
                            pending_progress, last_report = 0, time.perf_counter()
                except (FormatError, SampleError) as exc:
                    processor.note(exc, exc.url or url, exc.key, "read")  # errors/ names where it broke
                    raise _TaskFailed(str(exc), INPUT) from exc
            finally:
                stream.close()
            stats.shards_in += 1
            stats.bytes_in += counted.count
        processor.check_rate(final=True)
        infos: list[ShardInfo] = writer.close()
    if progress is not None and pending_progress:
        progress(pending_progress)
    return infos
