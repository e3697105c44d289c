"""JobSpec: every setting of a job, once, as one frozen value.

It lives in the task layer, below the job layer, because run_task reads it (TaskContext holds it):
the job layer (ShardJob = fn + JobSpec, plan, driver) builds on it.

A job used to be a bag of attributes whose list was written out by hand in six places (the ShardJob
signature, describe(), settings(), TaskContext, job.json's list, the job-file keys); a setting missing
from one list silently ran differently somewhere (a job file's BATCH_SIZE ran one sample at a time in
a pod). Now each setting is a field here, and everything that lists settings derives from the fields:

    describe()        plan.json's "job": the identity, shape and policy fields (optional ones when set)
    settings()        the fields that shape the output bytes: with the tasks, the plan's fingerprint
    record_settings() job.json: every recorded field, so a pod rebuilds a job file's job identically
    JOB_FILE_KEYS     the UPPER_CASE names and JOB = dict(...) keys a job file may set, `--set` keys
    TaskContext       holds the spec itself (task/context.py)
    CLI flags         `setting_help(name)` gives each flag's help from the field's metadata

Variants are made with `dataclasses.replace` (`ShardJob.replace`): a trial (`limit`), a debug run, a run
directory bound on a worker. Nothing patches a job from outside.

Each field's metadata says its role:

    location  where things go (inputs, outputs, run_dir): recorded, not in the fingerprint (the tasks are)
    shape     shapes the output bytes: in settings() and therefore in the plan's fingerprint
    policy    how failures and retries are handled: described, never in the fingerprint
    secret    credentials (storage_options): redacted whenever written down
    function  arguments of the job's function (fn_args, fn_kwargs): travel with the pickled job only
    identity  the job's name
    runtime   this run only (debug, limit): never recorded, never a job-file key
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from shardflow.errors import DEFAULT_ON_ERROR_JOB, JobError, check_on_error
from shardflow.shards.checksums import check_checksum
from shardflow.shards.writer import MIN_MAXSIZE  # the writer's bound, checked at the setting too
from shardflow.storage.options import redact, strip_redacted
from shardflow.task.devices import DEVICES
from shardflow.text import safe_repr

LOCATION, SHAPE, POLICY, SECRET, FUNCTION, IDENTITY, RUNTIME = (
    "location", "shape", "policy", "secret", "function", "identity", "runtime")
UNLIMITED = 1 << 62  # maxcount / maxsize when not set: rollover never happens


def _setting(default: Any, role: str, help: str, *, when: str | None = None, factory: Any = None) -> Any:
    """A JobSpec field. `when`: described (and fingerprinted) only when that field is set (not None), so
    plans of jobs that never set it keep their earlier fingerprint."""
    metadata = {"role": role, "help": help, "when": when}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class JobSpec:
    """Every setting of a ShardJob (see ShardJob for what the function does with them)."""

    inputs: Any = _setting(None, LOCATION, "input shards: a brace pattern, glob, URL list or dataset spec")
    outputs: Any = _setting(None, LOCATION, "output shards: one per task, or a pattern with {task}, {name}, {part}")
    decode: str | None = _setting(None, SHAPE, "what fn receives for image members; any value also decodes "
                                  "the other members by extension (json, cls/txt, npy, ...); None: every member "
                                  "as raw bytes")
    encode: dict[str, Any] = _setting(None, SHAPE, "Encoder options (png_compress_level, jpeg_quality, ...)",
                                      factory=dict)
    on_error: str = _setting(DEFAULT_ON_ERROR_JOB, POLICY, "a bad sample: raise, skip (logged) or warn")
    seed: int = _setting(0, SHAPE, "the job seed per-sample randomness derives from")
    maxcount: int | None = _setting(None, SHAPE, "at most N samples per output shard")
    maxsize: float | None = _setting(None, SHAPE, "at most this many bytes per output shard")
    inputs_per_task: int = _setting(1, SHAPE, "input shards per task")
    run_dir: str | None = _setting(None, LOCATION, "run directory (default: _shardflow beside the outputs)")
    storage_options: dict[str, Any] | None = _setting(None, SECRET, "fsspec storage options (flat or per prefix)")
    max_failure_rate: float = _setting(0.5, POLICY, "a task fails when its failed samples are more than this "
                                       "fraction of the samples it read (judged at its end; while it runs, "
                                       "once 10 have failed)")
    io_retries: int = _setting(3, POLICY, "retries of a task's storage errors")
    retry_backoff: float = _setting(1.0, POLICY, "seconds before the first retry (doubling)")
    retry_budget: float | None = _setting(None, POLICY, "seconds the run directory's store may stay unreachable "
                                          "before the run stops with 'lost the store' (default 120)",
                                          when="retry_budget")
    allow_pickle: bool = _setting(False, POLICY, "decode .pickle/.pyd members (runs code from the data)")
    allow_pipe: bool = _setting(False, POLICY, "allow pipe:CMD URLs (they run shell commands)")
    name: str | None = _setting(None, IDENTITY, "the job's name (default: the function's)")
    params: dict[str, Any] | None = _setting(None, SHAPE, "a job file's PARAMS, recorded with the plan")
    fn_args: tuple[Any, ...] = _setting((), FUNCTION, "positional arguments of a class fn's constructor")
    fn_kwargs: dict[str, Any] = _setting(None, FUNCTION, "keyword arguments of a class fn's constructor",
                                         factory=dict)
    batch_size: int | None = _setting(None, SHAPE, "fn takes lists of up to N samples (None: one sample)",
                                      when="batch_size")
    collate: bool = _setting(False, SHAPE, "batches as a dict of columns", when="batch_size")
    device: str | None = _setting(None, SHAPE, "the device the job asks for: cpu, cuda or auto", when="device")
    checksum: str | None = _setting(None, SHAPE, "the hash of each output shard's receipt: sha256 (None, the "
                                    "default), blake3 or xxh3_128 (the 'checksums' extra)", when="checksum")
    debug: bool = _setting(False, RUNTIME, "the first failure raises its own exception (serial runs)")
    limit: int | None = _setting(None, RUNTIME, "input samples per task (a trial run)")

    def __post_init__(self) -> None:
        check_on_error(self.on_error, error=JobError)
        if isinstance(self.inputs_per_task, bool) or not isinstance(self.inputs_per_task, int) \
                or self.inputs_per_task < 1:
            raise JobError(f"inputs_per_task must be an integer >= 1, not {self.inputs_per_task!r}")
        _check_batching(self.batch_size, self.collate, self.device)
        _check_decode(self.decode)
        _check_rollover(self.maxcount, self.maxsize)
        if self.checksum is not None:
            try:
                check_checksum(self.checksum)
            except (ValueError, ImportError) as exc:
                raise JobError(str(exc)) from None
        normal = {
            "encode": dict(self.encode or {}),
            "maxcount": int(self.maxcount) if self.maxcount else None,
            "maxsize": float(self.maxsize) if self.maxsize else None,
            "fn_args": tuple(self.fn_args or ()),
            "fn_kwargs": dict(self.fn_kwargs or {}),
            "inputs": list(self.inputs) if isinstance(self.inputs, (list, tuple)) else self.inputs,
            "outputs": list(self.outputs) if isinstance(self.outputs, (list, tuple)) else self.outputs,
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        if self.encode:  # a misspelled option refused now, not as a TypeError when the first task runs
            checked_names(self.encode, encode_options(), "encode option")

    # -- what derives from the fields -----------------------------------------------------------
    @classmethod
    def fields_with(cls, *roles: str) -> tuple[dataclasses.Field, ...]:
        return tuple(f for f in dataclasses.fields(cls) if f.metadata["role"] in roles)

    def _present(self, f: dataclasses.Field) -> bool:
        when = f.metadata["when"]
        return when is None or getattr(self, when) is not None

    def describe(self) -> dict[str, Any]:
        """plan.json's description: identity, shape and policy fields (no locations, no credentials)."""
        return {f.name: getattr(self, f.name) for f in self.fields_with(IDENTITY, SHAPE, POLICY) if self._present(f)}

    def settings(self) -> dict[str, Any]:
        """The fields that shape the output bytes, as canonical JSON values (the plan's fingerprint)."""
        chosen = {f.name: getattr(self, f.name) for f in self.fields_with(SHAPE) if self._present(f)}
        return json.loads(json.dumps(chosen, sort_keys=True, default=repr))

    def record_settings(self) -> dict[str, Any]:
        """Every field a rebuilt job needs (job.json): all but runtime ones, the run directory (the
        worker binds its own) and the function's own arguments (a job file has none); redacted."""
        safe = self.replace(**self.redactions())
        return {f.name: getattr(safe, f.name) for f in dataclasses.fields(self)
                if f.metadata["role"] not in (RUNTIME, FUNCTION) and f.name != "run_dir"}

    def redactions(self) -> dict[str, Any]:
        """The changes that make this spec safe to write down (job.pkl, job.json): secret fields without
        their credentials (dropped, so a worker takes its own), URL passwords out of the locations."""
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["role"] == SECRET:
                changes[f.name] = strip_redacted(redact(value))
            elif f.metadata["role"] == LOCATION and f.name != "run_dir":
                changes[f.name] = redact(value)
        return changes

    def replace(self, **changes: Any) -> JobSpec:
        """A copy with `changes` (unknown names refused with the valid ones)."""
        return dataclasses.replace(self, **checked_names(changes))

    @property
    def rollover(self) -> tuple[int, float]:
        """(maxcount, maxsize) with UNLIMITED for what is not set: what the writer compares against."""
        return self.maxcount or UNLIMITED, float(self.maxsize or UNLIMITED)


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(JobSpec))
# what a job file may set (UPPER_CASE names, JOB = dict(...), --set): not its function's arguments, not
# PARAMS (the module's own dict), not this run's runtime switches
JOB_FILE_KEYS = tuple(f.name for f in dataclasses.fields(JobSpec)
                      if f.metadata["role"] not in (RUNTIME, FUNCTION) and f.name != "params")


def checked_names(settings: Mapping[str, Any], valid: Sequence[str] = SETTING_NAMES,
                  what: str = "job setting") -> Mapping[str, Any]:
    """`settings` when every key is one of `valid` (default: the JobSpec fields), else a JobError
    listing the valid names: the one wording of a misspelled name, for settings and their options."""
    unknown = sorted(set(settings) - set(valid), key=str)
    if unknown:
        raise JobError(f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                       f"valid: {', '.join(valid)}")
    return settings


def encode_options() -> tuple[str, ...]:
    """The names `encode=` may hold: the Encoder's keyword arguments (it is made as Encoder(**encode))."""
    from shardflow.codecs.encoder import Encoder  # not at import: the codecs bring numpy

    return tuple(name for name in inspect.signature(Encoder).parameters)


def setting_default(name: str) -> Any:
    """The default of a setting (a fresh one for dict fields)."""
    f = next(f for f in dataclasses.fields(JobSpec) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def setting_help(name: str) -> str:
    """The one-line help of a setting: the CLI flags that set job settings use it."""
    return next(f.metadata["help"] for f in dataclasses.fields(JobSpec) if f.name == name)


def _check_rollover(maxcount: Any, maxsize: Any) -> None:
    """Refuse rollover bounds the writer cannot use (negative, nan, inf, a fraction of a tar's blocks)
    when the job is made, naming the setting, rather than as a failed task at run time. 0 and None
    mean not set (no rollover), as they always did."""
    for name, value, least in (("maxcount", maxcount, 1), ("maxsize", maxsize, MIN_MAXSIZE)):
        if value is None or (value == 0 and not isinstance(value, bool)):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or value < least or (name == "maxcount" and value != int(value)):
            kind = "a whole number" if name == "maxcount" else "a number of bytes"
            raise JobError(f"{name} must be {kind} >= {least} (or None: no limit), not {value!r}")


def _check_decode(decode: Any) -> None:
    """Refuse a decode spec no decoder takes when the job is made, naming the valid ones (the codecs'
    own checks: codecs.gpu.gpu_spec for a `-cuda` suffix, codecs.images.check_spec), not when a task
    makes its decoder."""
    if decode is None:
        return
    from shardflow.codecs.gpu import gpu_spec  # not at import: the codecs bring numpy
    from shardflow.codecs.images import check_spec

    try:
        base = gpu_spec(decode, stacklevel=4)  # its message names the setting
    except ValueError as exc:
        raise JobError(str(exc)) from None
    try:
        check_spec(base or decode)
    except ValueError as exc:
        raise JobError(f"decode={safe_repr(decode)}: {exc}") from None


def _check_batching(batch_size: Any, collate: Any, device: Any) -> None:
    """Refuse bad batching values when the job is made, with the setting's name in the message."""
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise JobError(f"batch_size must be an integer >= 1 (or None: one sample at a time), not {batch_size!r}")
    if not isinstance(collate, bool):
        raise JobError(f"collate must be true or false, not {collate!r}")
    if collate and batch_size is None:
        raise JobError("collate=True needs batch_size (it shapes batches into columns)")
    if device is not None and device not in DEVICES:
        raise JobError(f"device must be one of {', '.join(DEVICES)} (or None), not {device!r}")
