"""What a cluster backend (Dask, Ray) concludes from its workers' preflight answers: one owner.

Each backend asks every worker (Dask) or node (Ray) once, its own way, whether it can import shardflow
and see the run directory and the inputs (backends/dask/on_worker.worker_check, backends/ray/on_worker.
node_check). The answers mean the same on both, and so do the messages a user gets: one line naming
the machines and what to do, instead of every task failing there.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

from shardflow.backends.dask.wire import missing_module_message
from shardflow.errors import JobError
from shardflow.version import __version__


def judge_answers(answers: Iterable[tuple[str, Any]], machine: str, run_dir: str) -> None:
    """Raise JobError when a machine cannot import a module, see the inputs or see the run directory;
    warn when its shardflow differs. `answers`: (machine name, its answer dict or the
    ModuleNotFoundError it raised); anything else means the check could not run there (ignored: a
    preflight that cannot run must not stop a run that could). `machine`: "Dask worker", "Ray node"."""
    blind = []
    for name, answer in answers:
        if isinstance(answer, ModuleNotFoundError):
            raise JobError(missing_module_message(f"{name} ({machine})", answer.name))
        if not isinstance(answer, dict):
            continue
        if answer.get("sees_run_dir") is False:
            blind.append(name)
        if answer.get("blind_inputs"):
            raise JobError(f"{machine} {name} cannot see the inputs ({'; '.join(answer['blind_inputs'][:3])}): put "
                           f"them on storage every {machine.split()[-1]} reaches (s3://, gs://, or a shared "
                           "filesystem mounted at the same path), and give it the credentials")
        if answer.get("shardflow") != __version__:
            print(f"shardflow: warning: {machine} {name} has shardflow {answer.get('shardflow')}, this driver "
                  f"{__version__}", file=sys.stderr)
    if blind:
        raise JobError(
            f"{len(blind)} {machine}(s) ({', '.join(blind[:3])}{', ...' if len(blind) > 3 else ''}) cannot see "
            f"the run directory {run_dir}: put the run directory and the outputs on storage every "
            f"{machine.split()[-1]} reaches (s3://, gs://, or a shared filesystem mounted at the same path), "
            "e.g. run_dir='s3://bucket/run'")
