"""Job files whose per-sample step is a shell command: `COMMAND = "..."` instead of `def process`.

    COMMAND = "convert *.jpg -resize 256x256 small.png && rm *.jpg"
    PARALLEL = 4             # optional: samples of a task at once (threads)
    TIMEOUT = 120            # optional: seconds per sample
    ENV = {"OMP_NUM_THREADS": "1"}   # optional: added to the clean environment
    PASS_ENV = ["HOME_CACHE"]        # optional: variables copied from the worker's environment
    JOB = dict(maxcount=1000)        # as in any job file

load_job_file calls `install_command(module, path)` right after the file ran: the module's `process`
becomes a ShellCommand (see job/shell.py), so everything else (overrides, plan, job.pkl, Dask,
`shardflow k8s`/`argo`) treats the file like any other job.
"""

from __future__ import annotations

import types
from pathlib import Path

from shardflow.errors import JobError
from shardflow.job.shell import ShellCommand

_SETTINGS = {"PARALLEL": "parallel", "TIMEOUT": "timeout", "ENV": "env", "PASS_ENV": "pass_env", "TMPDIR": "tmpdir"}


def install_command(module: types.ModuleType, path: Path) -> types.ModuleType:
    """Give a COMMAND job file its `process` (a ShellCommand); other job files pass unchanged."""
    names = vars(module)
    command = names.get("COMMAND")
    if command is None:
        return module
    if "process" in names:
        raise JobError(f"job file {path} defines both COMMAND and process(); keep one")
    job = names.get("JOB") if isinstance(names.get("JOB"), dict) else {}
    if names.get("DECODE") is not None or job.get("decode") is not None:
        raise JobError(f"job file {path}: a COMMAND job hands the command raw member bytes; remove DECODE")
    kwargs = {arg: names[name] for name, arg in _SETTINGS.items() if name in names}
    try:
        module.process = ShellCommand(command, **kwargs)  # type: ignore[attr-defined]
    except (JobError, TypeError, ValueError) as exc:
        raise JobError(f"job file {path}: bad COMMAND settings: {exc}") from None
    return module
