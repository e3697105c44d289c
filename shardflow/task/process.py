"""One input sample through the job: decode -> fn -> encode, each step under the error policy.

fn(sample) may return a dict (1:1), None (dropped: a filter), an iterable of dicts (1:N, keys must
stay unique in the task) or raise SkipSample(reason). Values fn passes through untouched are written
as the input's own bytes (no lossy re-encode of an unchanged JPEG). Every failure goes to
`SampleFailures.record`, which fails the task on a fatal exception (MemoryError, SystemError:
errors.FATAL_ERRORS) whatever the policy, so the per-sample path pays nothing for that check.

A job that decodes (images, tensors) runs its tasks overlapped, as the batched path does
(`SampleProcessor.write_all`): read + decode in one thread, fn in the task's thread, encode + write in
a third, handed on in small chunks, in order, so the bytes are those of process() sample by sample.
The codecs (simplejpeg, Pillow's PNG encoder, zlib) and torch's ops release the GIL: a worker whose
neighbour has no task left (the run's tail) uses the idle core, and no stage waits on another's I/O.
Jobs on raw bytes stay inline: their stages are Python that holds the GIL, where threads only add
hand-offs (measured slower on 60 KB passthrough).
"""

from __future__ import annotations

import types
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from shardflow.errors import JobError, SampleError, ShardflowError, SkipSample
from shardflow.rundir.stats import Stats
from shardflow.shards.keys import Sample, check_key
from shardflow.task.context import TaskContext
from shardflow.task.failures import SampleFailures, encode_stage
from shardflow.task.overlap import ENABLED as OVERLAP_ENABLED
from shardflow.task.overlap import read_ahead
from shardflow.task.overlap import sink as make_sink
from shardflow.task.seeds import seed_globals, stable_seed


class SampleProcessor:
    """Per-sample steps of a task with the job's error policy applied to each."""

    def __init__(self, context: TaskContext, stats: Stats, failures: SampleFailures,
                 fn: Callable[[Sample], Any] | None = None) -> None:
        self.context = context
        self.fn = fn if fn is not None else context.fn  # made once per worker (task/worker_fn.py)
        self.stats = stats
        self.failures = failures
        self.produced_by: dict[str, str] = {}  # output key -> input key, to name both on a clash

    def process(self, sample: Sample) -> list[Sample]:
        """Decode, call fn and encode one input sample; returns encoded outputs (maybe none)."""
        url, key = sample["__url__"], sample["__key__"]
        decoder = self.context.decoder
        try:
            decoded = decoder(sample) if decoder is not None else sample
        except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's problem
            self.failures.record(exc, url, key, "decode")
            return []
        called = self._call(sample, decoded)
        if called is None:
            return []
        return self._encode_all(called[0], called[1], url, key)

    def _call(self, sample: Sample, decoded: Sample) -> tuple[list[Sample], dict[int, tuple[str, bytes]]] | None:
        """fn on one decoded sample under the policy: (outputs, unchanged raw values), None when it
        left nothing to write (skipped, failed, dropped)."""
        url, key = sample["__url__"], sample["__key__"]
        seed_globals(stable_seed(self.context.spec.seed, key))
        try:
            outputs = as_outputs(self.fn(decoded), key)
        except SkipSample as skip:
            self.stats.skipped += 1
            self.stats.skip_reasons[skip.reason] += 1
            return None
        except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
            self.failures.record(exc, url, key, "process")
            return None
        if not outputs:
            self.stats.dropped += 1
            return None
        return outputs, unchanged_values(sample, decoded, self.context.decoder)

    def _encode_all(self, outputs: list[Sample], raw: dict[int, tuple[str, bytes]], url: str, key: str,
                    record: Callable[[BaseException, str, str, str], None] | None = None) -> list[Sample]:
        """Check each output's key and encode it; a failure goes to `record` (default: the policy)."""
        record = record or self.failures.record
        encoded = []
        for out in outputs:
            out_key = out["__key__"]
            problem = output_key_problem(out_key, key, self.produced_by, url)
            if problem is not None:
                record(problem, url, key, "read" if isinstance(problem, SampleError) else "process")
                continue
            try:
                encoded.append(self.context.encoder(reuse_raw(out, raw)))
            except Exception as exc:  # noqa: BLE001
                record(exc, url, key, encode_stage(exc))
                continue
            self.produced_by[out_key] = key
        return encoded

    # -- overlapped: read + decode | fn | encode + write, each in its own thread -----------------
    def overlaps(self) -> bool:
        """Whether tasks run overlapped: jobs that decode (their codecs release the GIL)."""
        return OVERLAP_ENABLED and self.context.decoder is not None

    def write_all(self, open_samples: Callable[[Callable[[Exception], None]], Iterable[Sample]], url: str,
                  writer: Any, progress: Callable[[int], None], limit: int | None = None) -> None:
        """Stream one input shard: samples read and decoded ahead, fn here, outputs encoded and
        written behind, in order. `limit`: at most this many more input samples (a trial)."""
        late: list[tuple[BaseException, str, str | None, str]] = []  # failures met in the other threads
        reader = read_ahead(self._decoded_chunks(open_samples, url, limit, late))
        sink = make_sink(lambda chunk: self._write_chunk(chunk, url, writer, late))
        try:
            for chunk in reader:
                self._record_late(late)
                called = []
                for sample, decoded in chunk:
                    self.stats.samples_in += 1
                    if isinstance(decoded, Exception):
                        self.failures.record(decoded, url, sample["__key__"], "decode")
                        continue
                    result = self._call(sample, decoded)
                    if result is not None:
                        called.append((sample["__key__"], *result))
                if called:
                    sink.put(called)
                progress(len(chunk))
            sink.finish()
        finally:
            sink.close()
            reader.close()
        self._record_late(late)

    def _record_late(self, late: list[tuple[BaseException, str, str | None, str]]) -> None:
        """Failures the reader or writer thread met, recorded (and judged) in the task's thread."""
        while late:
            self.failures.record(*late.pop(0))

    def _decoded_chunks(self, open_samples: Callable[[Callable[[Exception], None]], Iterable[Sample]], url: str,
                        limit: int | None, late: list) -> Iterator[list[tuple[Sample, Any]]]:
        """The reader thread: (sample, decoded or the decode error) in chunks of a few samples."""
        def report(error: Exception) -> None:
            late.append((error, getattr(error, "url", None) or url, getattr(error, "key", None), "read"))

        samples: Iterable[Sample] = open_samples(report)
        arrange = getattr(self.context.fn, "arrange_samples", None)  # as run_task's inline loop finds it
        if arrange is not None:
            samples = arrange(samples)
        if limit is not None:
            samples = islice(samples, max(limit, 0))
        decoder = self.context.decoder
        chunk: list[tuple[Sample, Any]] = []
        size = 0
        for sample in samples:
            try:
                decoded = decoder(sample)
            except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's problem
                decoded = exc
            chunk.append((sample, decoded))
            size += sum(len(v) for v in sample.values() if isinstance(v, bytes))
            if len(chunk) == _CHUNK or size >= _CHUNK_BYTES:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _write_chunk(self, chunk: list[tuple[str, list[Sample], dict[int, tuple[str, bytes]]]], url: str,
                     writer: Any, late: list) -> None:
        """The writer thread: encode and write a chunk's outputs, in order."""
        def record(error: BaseException, url_: str, key: str, where: str) -> None:
            late.append((error, url_, key, where))

        for key, outputs, raw in chunk:
            for encoded in self._encode_all(outputs, raw, url, key, record):
                try:
                    writer.write(encoded)
                except SampleError as exc:  # refused before a byte was written: this sample's failure
                    record(refused_output(exc, url, key), url, key, "process")
                    continue
                self.stats.samples_out += 1


# Samples handed between the threads at once: fewer hand-offs for small images; a chunk ends early once
# its encoded input passes _CHUNK_BYTES, so large images go one by one (about five in flight a task, as
# the batched path with batches of one), whatever their size.
_CHUNK = 4
_CHUNK_BYTES = 256 << 10


# how output_key_problem says an input key came twice: a property of the data, the same on every rerun
# (tools.runner's hint never suggests --retry-failed for it)
REPEATED_INPUT_KEY = "produced twice (by input sample"


def output_key_problem(out_key: Any, in_key: str, produced_by: dict[str, str], url: str
                       ) -> ShardflowError | None:
    """Why an output key cannot be written in this task (None when it can): not a key that reads back
    identically, or already produced from another input sample (`produced_by`: output key -> input key).

    Whose fault it is decides the error: when the INPUT's own key cannot be written either (member
    names of the shard that are absolute or hold '..': `tar -P`, hostile archives), the shard is at
    fault, not the job: a SampleError (bad input, skipped under the policy, `input` when the task
    fails), so a built-in job like split is never called buggy for it. A bad key the job made from a
    good one stays a JobError (a bug in the job). check_key of the input runs on this failure path only."""
    why = check_key(out_key)
    if why is not None:
        input_why = check_key(in_key)
        if input_why is not None:
            return SampleError(f"bad member names in the shard (input, not the job): {input_why}", url=url, key=in_key)
        return JobError(why, url=url, key=in_key)
    if out_key in produced_by:
        if produced_by[out_key] == in_key:  # the input holds the key twice
            return JobError(f"output key {out_key!r} {REPEATED_INPUT_KEY} {in_key!r})", url=url, key=in_key)
        by = f"by input samples {produced_by[out_key]!r} and {in_key!r}"
        return JobError(f"output key {out_key!r} produced twice ({by})", url=url, key=in_key)
    return None


def refused_output(error: SampleError, url: str, in_key: str) -> JobError:
    """The failure of one input sample whose output the writer refused (shards.samples.sample_members:
    an extension or value it cannot write so that it reads back; it raises before writing anything, so
    the shard being written stays whole). The output is the job's: a JobError naming the shard and the
    input key, which the policy logs and skips, and which stops the run as a job bug when every sample
    fails with it. Input extensions are never refused: reader and writer share keys.check_ext."""
    refused = JobError(f"the writer refused an output of this sample: {error.reason}", url=url, key=in_key)
    refused.__cause__ = error
    return refused


def unchanged_values(raw: Sample, decoded: Sample, decoder: Any) -> dict[int, tuple[str, bytes]]:
    """id(decoded value) -> (ext, the bytes it was decoded from), for values the job may pass through
    untouched.

    `decoder` is the one that made `decoded` from `raw`. A dataset spec's view (extensions, rename) runs
    inside it (job/inputs.py), so a decoded name need not be the raw member of that name: after
    `rename: {txt: json}` the decoded `json` comes from the shard's `txt`, and the shard's own `json` is
    gone. The raw side is the raw sample seen through that same view (the decoder's `raw_view`: the one
    rule, shards.spec.Collection.view), so reuse writes the bytes a value came FROM.
    """
    if decoded is raw:
        return {}
    view = getattr(decoder, "raw_view", None)
    source = view(raw) if view is not None else raw
    return {id(decoded[ext]): (ext, data) for ext, data in source.items()
            if not ext.startswith("__") and ext in decoded and decoded[ext] is not data}


def reuse_raw(out: Sample, raw: dict[int, tuple[str, bytes]]) -> Sample:
    """Write the input's own bytes for values fn returned unchanged under the same extension.

    Re-encoding an untouched JPEG would lose quality and time; the original bytes are exact.
    """
    if not raw:
        return out
    swaps = {ext: raw[id(v)][1] for ext, v in out.items() if id(v) in raw and raw[id(v)][0] == ext}
    return {**out, **swaps} if swaps else out


def as_outputs(result: Any, key: str) -> list[Sample]:
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
