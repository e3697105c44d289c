"""Job files: a plain Python file that defines a job, runnable as `shardflow run FILE`.

The convention (what `load_job` reads from the file):

    def process(sample): ...          # required: the per-sample function (see ShardJob)
    PARAMS = {"size": 256}            # optional: parameters process() reads as PARAMS["size"]
    JOB = dict(decode="torchrgb",     # optional: defaults for ShardJob keyword arguments
               maxcount=1000)
    DECODE = "torchrgb"               # optional: the same, one UPPER_CASE name per ShardJob argument
                                      # (DECODE, ENCODE, ON_ERROR, SEED, MAXCOUNT, MAXSIZE,
                                      # INPUTS_PER_TASK, MAX_FAILURE_RATE, IO_RETRIES, ...)

Overrides (`--set key=value` on the command line, `overrides={...}` here) name either a ShardJob
argument (`maxcount`, `decode`, `on_error`, ...) or a PARAMS key; a dotted key sets one entry of a
dict-valued setting (`encode.png_compress_level=6`, `params.x.y`); the prefixes `job.` and `params.`
say explicitly which one is meant. Command-line values are parsed as JSON when they parse (`3`,
`true`, `[1, 2]`, `{"a": 1}`, `null`), else kept as text; a value for a PARAMS key whose default is
text stays text (`--set label_key=3` gives "3"). An unknown key is an error listing the valid ones.

Precedence, lowest first: ShardJob's defaults, the file's JOB / UPPER_CASE names, overrides, then
the keyword arguments of `load_job` itself (inputs, outputs, run_dir, storage_options, ...).

The file is executed as a fresh module on every load (so PARAMS overrides never leak between jobs)
under a private name, and registered with cloudpickle's `register_pickle_by_value`: its functions
and classes travel to worker processes, Dask workers and pods by value, so the file need not be
importable there. Modules it imports by name (torch, numpy, your installed packages) must be.

Built-in jobs: a bare name (`augment`, `resize`, `filter`, `reshard`) names a job shipped with
shardflow (`shardflow/jobs_builtin/`; the repository's `jobs/` links to them); anything with a `/` or
ending in `.py` is a path. `shardflow run augment` and `shardflow run jobs/augment.py` run the same.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import cloudpickle

from shardflow.errors import JobError
from shardflow.job.overrides import apply_overrides, parse_overrides, parse_value  # noqa: F401 - public here
from shardflow.job.shard_job import ShardJob
from shardflow.job.shell import install_command
from shardflow.task.spec import JOB_FILE_KEYS, checked_names
from shardflow.task.worker_fn import PerWorker, SetupCall

__all__ = [
    "JobFile", "load_job", "load_job_file", "job_from_file", "job_summary", "resolve_job_path", "builtin_jobs",
    "parse_overrides", "job_options", "BUILTIN_DIR",
]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # shardflow/
BUILTIN_DIR = PACKAGE_DIR / "jobs_builtin"
_FUNCTION = "process"


def job_options() -> tuple[str, ...]:
    """Names of the settings a job file may set (JobSpec's fields but the runtime ones, the function's
    arguments and params, which is the module's PARAMS)."""
    return JOB_FILE_KEYS


def builtin_jobs() -> dict[str, Path]:
    """Built-in job name -> file: the repository's jobs/ in a source checkout (pip install -e .),
    else the jobs shipped in the package (a wheel); jobs/*.py link to those."""
    found: dict[str, Path] = {}
    root = PACKAGE_DIR.parent
    folders = [BUILTIN_DIR]
    if (root / "pyproject.toml").is_file():
        folders.insert(0, root / "jobs")
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.glob("*.py")):
                if not path.name.startswith("_"):
                    found.setdefault(path.stem, path)
    return found


def resolve_job_path(spec: str | os.PathLike[str]) -> Path:
    """A job file path, or a built-in job name (`augment`) -> the file to load."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if "/" not in text and os.sep not in text:
        builtin = builtin_jobs().get(text[:-3] if text.endswith(".py") else text)
        if builtin is not None:
            return builtin
    names = ", ".join(builtin_jobs()) or "none found"
    raise JobError(f"job file {text!r} does not exist and is not a built-in job (built-in: {names})")


@dataclass
class JobFile:
    """A loaded job file: its module, the function, and the settings it declares."""

    path: Path
    module: types.ModuleType
    fn: Any
    defaults: dict[str, Any] = field(default_factory=dict)  # ShardJob kwargs the file sets
    params: dict[str, Any] | None = None  # the module's PARAMS dict (None when it has none)
    doc: str = ""

    @property
    def name(self) -> str:
        return self.path.stem

    def summary(self) -> str:
        """First line of the job file's docstring."""
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""


def job_summary(spec: str | os.PathLike[str]) -> str:
    """First line of a job file's docstring, read without running the file (no imports)."""
    import ast

    path = resolve_job_path(spec)
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise JobError(f"cannot read job file {path}: {exc}") from None
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _module_name(path: Path) -> str:
    digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=4).hexdigest()
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"_shardflow_job_{stem}_{digest}"


def _syntax_message(path: Path, exc: SyntaxError) -> str:
    line = f", line {exc.lineno}" if exc.lineno else ""
    text = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
    return f"job file {path}{line}: {type(exc).__name__}: {exc.msg}{text}"


def _error_line(path: Path, exc: BaseException) -> str:
    """The line of the job file where `exc` was raised while the file ran (last frame in it)."""
    line = None
    for frame in inspect.getinnerframes(exc.__traceback__, context=0) if exc.__traceback__ else ():
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f", line {line}" if line else ""


def load_job_file(spec: str | os.PathLike[str]) -> JobFile:
    """Execute a job file (or built-in job name) as a fresh module and read its conventions.

    Raises JobError with a one-line message naming the file (and line) on a syntax error, an
    exception while the file runs, a missing `process`, or malformed JOB / PARAMS.
    """
    path = resolve_job_path(spec)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"cannot read job file {path}: {exc}") from None
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError / TabError are SyntaxErrors too
        raise JobError(_syntax_message(path, exc)) from None
    name = _module_name(path)
    module = types.ModuleType(name, None)
    module.__file__ = str(path)
    previous = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses and friends look their module up while it runs
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        raise JobError(f"job file {path}{_error_line(path, exc)}: {type(exc).__name__}: {exc}") from None
    cloudpickle.register_pickle_by_value(module)
    return _read_conventions(path, install_command(module, path))  # COMMAND = "..." files


# -- the function a job file gives: process, process_batch, setup() ----------------------------
# The function a job file defines, read by job/jobfile.py: `process`, `process_batch`, `setup`.
#
#     def process(sample): ...            # per sample (or a batch, when BATCH_SIZE is set)
#     def process_batch(batch): ...       # instead of process: a list of samples; BATCH_SIZE default 64
#     def setup(): return model           # optional: runs ONCE per worker, before its first task;
#     def process(sample, state): ...     #   its return value is the second argument of process /
#                                         #   process_batch (one convention: no module globals to mutate)
#
# setup() does not run where the job is only planned or submitted (`shardflow plan`, `k8s`, `argo`):
# it runs in each worker (process, Dask worker, pod), once; if it raises, the tasks of that worker
# fail at once with one line naming the error and the run stops.
DEFAULT_BATCH_SIZE = 64


def job_function(module: types.ModuleType, path: Path) -> Any:
    """The job's fn: process or process_batch, made per worker through setup() when the file has one."""
    process, batch = getattr(module, "process", None), getattr(module, "process_batch", None)
    if callable(process) and callable(batch):
        raise JobError(f"job file {path} defines both process and process_batch; keep one")
    fn = batch if callable(batch) else process
    setup = getattr(module, "setup", None)
    if fn is None or not callable(setup):
        return fn
    return PerWorker(SetupCall, (setup, fn), name=f"setup() of {path.name}")


def batch_defaults(module: types.ModuleType, defaults: dict[str, Any]) -> dict[str, Any]:
    """A file with process_batch and no BATCH_SIZE batches by DEFAULT_BATCH_SIZE."""
    if callable(getattr(module, "process_batch", None)) and defaults.get("batch_size") is None:
        defaults["batch_size"] = DEFAULT_BATCH_SIZE
    return defaults


def _read_conventions(path: Path, module: types.ModuleType) -> JobFile:
    fn = job_function(module, path)  # process / process_batch, with setup() when defined
    if not callable(fn):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        hint = f" (it defines: {', '.join(public)})" if public else ""
        raise JobError(f"job file {path} defines no function `{_FUNCTION}(sample)`{hint}")
    options = job_options()
    defaults: dict[str, Any] = {}
    job = getattr(module, "JOB", None)
    if job is not None:
        if not isinstance(job, Mapping):
            raise JobError(f"job file {path}: JOB must be a dict of ShardJob arguments, not {type(job).__name__}")
        unknown = sorted(set(job) - set(options))
        if unknown:
            raise JobError(f"job file {path}: JOB has unknown ShardJob arguments {', '.join(map(repr, unknown))}; "
                           f"valid: {', '.join(options)}")
        defaults.update(copy.deepcopy(dict(job)))
    for option in options:
        upper = option.upper()
        if upper in vars(module):
            if option in defaults:
                raise JobError(f"job file {path} sets {option!r} twice: in JOB and as {upper}; keep one")
            defaults[option] = copy.deepcopy(vars(module)[upper])
    params = getattr(module, "PARAMS", None)
    if params is not None:
        if not isinstance(params, dict):
            raise JobError(f"job file {path}: PARAMS must be a dict, not {type(params).__name__}")
        clash = sorted(set(params) & set(options))
        if clash:
            raise JobError(f"job file {path}: PARAMS keys {', '.join(map(repr, clash))} are also ShardJob "
                           "arguments; rename them so `--set` is unambiguous")
        bad = sorted(repr(k) for k in params if not isinstance(k, str) or not k or "." in k or "=" in k)
        if bad:
            raise JobError(f"job file {path}: PARAMS keys must be non-empty str without '.' or '=': {', '.join(bad)}")
    return JobFile(path, module, fn, batch_defaults(module, defaults), params, module.__doc__ or "")


def load_job(
    path: str | os.PathLike[str],
    inputs: str | list[str] | None = None,
    outputs: str | list[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> ShardJob:
    """Load a job file (or built-in job name) and build its ShardJob.

    path:       a job file (`jobs/augment.py`) or a built-in job name (`augment`).
    inputs:     the input shard spec (required unless the file's JOB gives one).
    outputs:    the output spec or pattern (same).
    overrides:  `{key: value}` for ShardJob arguments or PARAMS keys (what `--set` gives; values
                from `parse_overrides` keep their text so str PARAMS stay str).
    **kwargs:   further ShardJob arguments that win over everything (run_dir, storage_options, ...).

    Raises JobError (one line, naming the file) for a broken file, an unknown key, or a bad value.
    The job's `name` defaults to the file's stem (`augment`).
    """
    jobfile = load_job_file(path)
    return job_from_file(jobfile, inputs=inputs, outputs=outputs, overrides=overrides, **kwargs)


def job_from_file(jobfile: JobFile, inputs: Any = None, outputs: Any = None,
                  overrides: Mapping[str, Any] | None = None, *, recorded: Mapping[str, Any] | None = None,
                  **kwargs: Any) -> ShardJob:
    """The ShardJob of an already loaded JobFile (see load_job). Mutates the module's PARAMS.

    `recorded`: the settings a run directory recorded for this file's job (job.json, written by the
    driver from the same file and overrides): they replace the file's own, so a pod runs the driver's job.
    """
    options = job_options()
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise TypeError(f"load_job() got unknown ShardJob arguments: {', '.join(unknown)}")
    if recorded is not None:
        settings: dict[str, Any] = dict(checked_names(recorded))
    else:
        settings = {"name": jobfile.name, **jobfile.defaults}
        apply_overrides(jobfile.path, jobfile.params, settings, overrides or {})
    settings.update({k: v for k, v in kwargs.items() if v is not None})
    if inputs is not None:
        settings["inputs"] = inputs
    if outputs is not None:
        settings["outputs"] = outputs
    for required in ("inputs", "outputs"):
        if settings.get(required) is None:
            raise JobError(f"job file {jobfile.path}: no {required} given (pass --{required} SPEC)")
    fn_inputs, fn_outputs = settings.pop("inputs"), settings.pop("outputs")
    if jobfile.params is not None:
        settings["params"] = jobfile.params  # recorded in plan.json and part of the plan's fingerprint
    try:
        return ShardJob(jobfile.fn, fn_inputs, fn_outputs, **settings)
    except JobError:
        raise
    except (TypeError, ValueError) as exc:
        raise JobError(f"job file {jobfile.path}: bad job settings: {exc}") from None
