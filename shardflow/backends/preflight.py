"""The preflight of a cluster backend (Dask, Ray): the question each worker answers and what the driver
concludes from the answers, one owner for both.

Each backend asks every worker (Dask: client.run) or node (Ray: a task pinned to it) once, its own
way, to run `worker_check`: can it import shardflow, see the run directory and the inputs. The answers
mean the same on both, and so do the messages a user gets (`judge_answers`): one line naming the
machines and what to do, instead of every task failing there.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

from shardflow.backends.paths import probe
from shardflow.backends.wire import missing_module_message
from shardflow.errors import JobError
from shardflow.rundir.layout import PLAN
from shardflow.version import __version__


def worker_check(run_dir_path: str | None, probes: Iterable[tuple[str, str, Any]] = ()) -> dict[str, Any]:
    """On a worker: can it see the run directory and the inputs (backends.paths.input_probes); which
    shardflow and Python it has."""
    seen = None if run_dir_path is None else os.path.exists(os.path.join(run_dir_path, PLAN))
    blind = [why for why in (probe(*p) for p in probes) if why is not None]
    return {"sees_run_dir": seen, "blind_inputs": blind, "shardflow": __version__, "python": sys.version.split()[0]}


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
