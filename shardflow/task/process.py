"""One input sample through the job: decode -> fn -> encode, each step under the error policy.

fn(sample) may return a dict (1:1), None (dropped: a filter), an iterable of dicts (1:N, keys must
stay unique in the task) or raise SkipSample(reason). Values fn passes through untouched are written
as the input's own bytes (no lossy re-encode of an unchanged JPEG).
"""

from __future__ import annotations

import types
from typing import Any, Callable

from shardflow.errors import JobError, SkipSample
from shardflow.rundir.stats import Stats
from shardflow.shards.keys import Sample, check_key
from shardflow.task.context import TaskContext
from shardflow.task.failures import SampleFailures
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
        seed_globals(stable_seed(self.context.spec.seed, key))
        try:
            outputs = as_outputs(self.fn(decoded), key)
        except SkipSample as skip:
            self.stats.skipped += 1
            self.stats.skip_reasons[skip.reason] += 1
            return []
        except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
            self.failures.record(exc, url, key, "process")
            return []
        if not outputs:
            self.stats.dropped += 1
            return []
        return self._encode_all(outputs, unchanged_values(sample, decoded), url, key)

    def _encode_all(self, outputs: list[Sample], raw: dict[int, tuple[str, bytes]], url: str, key: str) -> list[Sample]:
        encoded = []
        for out in outputs:
            out_key = out["__key__"]
            why = output_key_problem(out_key, key, self.produced_by)
            if why is not None:
                self.failures.record(JobError(why, url=url, key=key), url, key, "process")
                continue
            try:
                encoded.append(self.context.encoder(reuse_raw(out, raw)))
            except Exception as exc:  # noqa: BLE001
                self.failures.record(exc, url, key, "encode")
                continue
            self.produced_by[out_key] = key
        return encoded


def output_key_problem(out_key: Any, in_key: str, produced_by: dict[str, str]) -> str | None:
    """Why an output key cannot be written in this task (None when it can): not a key that reads back
    identically, or already produced from another input sample (`produced_by`: output key -> input key)."""
    why = check_key(out_key)
    if why is None and out_key in produced_by:
        why = f"output key {out_key!r} produced twice (by input samples {produced_by[out_key]!r} and {in_key!r})"
    return why


def unchanged_values(raw: Sample, decoded: Sample) -> dict[int, tuple[str, bytes]]:
    """id(decoded value) -> (ext, original bytes), for values the job may pass through untouched."""
    if decoded is raw:
        return {}
    return {id(decoded[ext]): (ext, data) for ext, data in raw.items()
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
