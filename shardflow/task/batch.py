"""Batched jobs: fn over lists of up to `batch_size` decoded samples, CPU stages overlapped.

    read + decode (thread) -> [batch k+1] -> fn(batch k) -> [outputs k-1] -> encode + write (thread)

A batch never spans input shards (so never tasks); the last batch of a shard may be short, and so
may one that lost samples to read or decode errors. Outputs are written in order, so a batched job
writes the same bytes as the same function applied sample by sample. The error policy still holds
per sample: a batch whose fn raises is retried one sample at a time, and each sample that fails
alone is logged with its key (one bad sample costs its batch a retry, not the task). A result that
breaks the contract as a whole (batch_values.batch_outputs' JobErrors: not a list or columns, or fewer
outputs than inputs without `__key__`) is not retried: a batch of one would pass where the batch did
not (a filter that forgets `__key__` would keep every sample), so it is a bug in the job and the run
stops (kind `user`, SampleFailures.job_bug). A fatal exception
(errors.FATAL_ERRORS: MemoryError, SystemError) is not retried: it fails the task. The global
generators are seeded from (job seed, first key of the batch) before each call; `sample_rng(sample)`
stays per sample, independent of batching.
"""

from __future__ import annotations

from types import GeneratorType
from typing import Any, Callable, Iterable, Iterator

from shardflow.errors import JobError, SampleError, SkipSample
from shardflow.rundir.stats import Stats
from shardflow.shards.keys import Sample
from shardflow.task.batch_values import batch_outputs, collate
from shardflow.task.context import TaskContext
from shardflow.task.failures import SampleFailures, encode_stage, fatal_error
from shardflow.task.overlap import read_ahead
from shardflow.task.overlap import sink as make_sink
from shardflow.task.process import SampleProcessor, output_key_problem, refused_output, reuse_raw, unchanged_values
from shardflow.task.seeds import seed_globals, stable_seed

Report = Callable[[Exception], None]
OpenSamples = Callable[[Report], Iterable[Sample]]  # read_samples(stream, url, report=...) of one input
_READ, _DECODED, _BAD = "read", "decoded", "bad"


class BatchProcessor:
    """The batched path of one task: stats and failures shared with the task, threads per input."""

    def __init__(self, context: TaskContext, stats: Stats, failures: SampleFailures, fn: Callable[[Any], Any]) -> None:
        self.context, self.stats, self.failures, self.fn = context, stats, failures, fn
        self.batch_size = int(context.spec.batch_size or 1)
        self.produced_by: dict[str, str] = {}  # output key -> input key, across the task
        self._encode_failures: list[tuple[BaseException, str, str, str]] = []  # from the writer thread

    # -- the task's thread ---------------------------------------------------------------------
    def write_all(self, open_samples: OpenSamples, url: str, writer: Any, progress: Callable[[int], None]) -> None:
        """Stream one input shard: batches read ahead, fn here, outputs written behind."""
        reader = read_ahead(self._chunks(open_samples))
        sink = make_sink(lambda outputs: self._write(outputs, writer))
        try:
            for chunk in reader:
                batch = self._admit(chunk, url)
                if batch:
                    sink.put((self._call(batch, url), url))
                progress(sum(1 for entry in chunk if entry[0] != _READ))
                self._record_encode_failures()
            sink.finish()
        finally:
            sink.close()
            reader.close()
            self._record_encode_failures()

    def _admit(self, chunk: list[tuple[Any, ...]], url: str) -> list[tuple[Sample, Sample]]:
        """Count the chunk's samples, log its read and decode failures; the (raw, decoded) pairs left."""
        self.stats.samples_in += sum(1 for entry in chunk if entry[0] != _READ)
        batch = []
        for kind, first, second in chunk:
            if kind == _READ:
                self.failures.record(first, getattr(first, "url", None) or url, getattr(first, "key", None), "read")
            elif kind == _BAD:
                self.failures.record(second, url, first["__key__"], "decode")
            else:
                batch.append((first, second))
        return batch

    def _call(self, batch: list[tuple[Sample, Sample]], url: str) -> list[tuple[Sample, str]]:
        """fn over the batch -> [(output, input key)]; on an exception, again one sample at a time."""
        decoded = [d for _, d in batch]
        keys = [d["__key__"] for d in decoded]
        seed_globals(stable_seed(self.context.spec.seed, keys[0]))
        try:
            result = _run_generator(self.fn(collate(decoded) if self.context.spec.collate else decoded))
        except SkipSample as skip:
            if len(batch) > 1:
                return self._one_by_one(batch, url)
            self.stats.skipped += 1
            self.stats.skip_reasons[skip.reason] += 1
            return []
        except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
            if len(batch) > 1 and fatal_error(exc) is None:  # a fatal one fails the task now (record)
                return self._one_by_one(batch, url)
            self.failures.record(exc, url, keys[0], "process")
            return []
        try:
            pairs = batch_outputs(result, keys)
        except JobError as exc:  # the result as a whole breaks the contract: no one sample is at fault
            raise self.failures.job_bug(exc, url, keys[0], f"the outputs of a batch of {len(keys)}") from exc
        raw: dict[int, tuple[str, bytes]] = {}
        for sample, value in batch:
            raw.update(unchanged_values(sample, value, self.context.decoder))
        self.stats.dropped += len(batch) - len({source for _, source in pairs})
        return self._checked(pairs, keys, raw, url)

    def _one_by_one(self, batch: list[tuple[Sample, Sample]], url: str) -> list[tuple[Sample, str]]:
        out = []
        for pair in batch:
            out.extend(self._call([pair], url))
        return out

    def _checked(self, pairs: list[tuple[Sample, int]], keys: list[str], raw: dict[int, tuple[str, bytes]],
                 url: str) -> list[tuple[Sample, str]]:
        """Outputs with valid, task-unique keys (others logged against their input), raw bytes reused."""
        out = []
        for sample, source in pairs:
            out_key, in_key = sample["__key__"], keys[source]
            problem = output_key_problem(out_key, in_key, self.produced_by, url)
            if problem is not None:
                self.failures.record(problem, url, in_key, "read" if isinstance(problem, SampleError) else "process")
                continue
            self.produced_by[out_key] = in_key
            out.append((reuse_raw(sample, raw), in_key))
        return out

    def _record_encode_failures(self) -> None:
        while self._encode_failures:
            error, url, key, where = self._encode_failures.pop(0)
            self.failures.record(error, url, key, where)

    # -- the reader thread ---------------------------------------------------------------------
    def _chunks(self, open_samples: OpenSamples) -> Iterator[list[tuple[Any, ...]]]:
        """Read + decode: chunks of batch_size samples (with the read errors met on the way)."""
        chunk: list[tuple[Any, ...]] = []
        samples = 0

        def report(error: Exception) -> None:
            chunk.append((_READ, error, None))

        for sample in open_samples(report):
            chunk.append((_DECODED, sample, None))
            samples += 1
            if samples == self.batch_size:
                yield self._decode(chunk)
                chunk, samples = [], 0
        if chunk:
            yield self._decode(chunk)

    def _decode(self, chunk: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        decoder = self.context.decoder
        if decoder is None:
            return [(kind, s, s if kind == _DECODED else x) for kind, s, x in chunk]
        raws = [s for kind, s, _ in chunk if kind == _DECODED]
        whole = getattr(decoder, "decode_batch", None)
        results = whole(raws) if whole is not None else [_try(decoder, s) for s in raws]
        done = iter(results)
        out = []
        for entry in chunk:
            if entry[0] != _DECODED:
                out.append(entry)
                continue
            value = next(done)
            out.append((_BAD, entry[1], value) if isinstance(value, Exception) else (_DECODED, entry[1], value))
        return out

    # -- the writer thread ---------------------------------------------------------------------
    def _write(self, item: tuple[list[tuple[Sample, str]], str], writer: Any) -> None:
        from shardflow.codecs.gpu import encode_on_device

        outputs, url = item
        encoder = self.context.encoder
        quality = getattr(getattr(encoder, "options", None), "jpeg_quality", 90)
        samples = encode_on_device([sample for sample, _ in outputs], quality)
        for sample, (_, key) in zip(samples, outputs):
            try:
                encoded = encoder(sample)
            except Exception as exc:  # noqa: BLE001 - logged by the task's thread
                self._encode_failures.append((exc, url, key, encode_stage(exc)))
                continue
            try:
                writer.write(encoded)
            except SampleError as exc:  # refused before a byte was written: this sample's failure
                self._encode_failures.append((refused_output(exc, url, key), url, key, "process"))
                continue
            self.stats.samples_out += 1


def _run_generator(result: Any) -> Any:
    """A generator's outputs as a list (its body, the job's own code, runs here, where the job's exceptions
    are caught and retried per sample); any other result as it is, for batch_outputs to check."""
    return list(result) if isinstance(result, GeneratorType) or hasattr(result, "__next__") else result


def _try(decoder: Callable[[Sample], Sample], sample: Sample) -> Any:
    try:
        return decoder(sample)
    except Exception as exc:  # noqa: BLE001 - a decode failure is this sample's problem
        return exc


def make_processor(context: TaskContext, stats: Stats, failures: SampleFailures) -> SampleProcessor | BatchProcessor:
    """The processor of a task: the job's fn made (once per worker) and its device checked first."""
    from shardflow.task.devices import check_task_device
    from shardflow.task.worker_fn import PerWorker, worker_fn

    check_task_device(context)
    fn = context.fn
    if isinstance(fn, PerWorker):
        fn = worker_fn(context.identity, fn)
    if context.fn_guard is not None:
        fn = context.fn_guard(fn)
    if context.spec.batch_size is None:
        return SampleProcessor(context, stats, failures, fn=fn)
    return BatchProcessor(context, stats, failures, fn)
