"""The click side of the one runner (shardflow/tools/runner.py): the flags of every command that runs a
job (`shardflow run`, split, cat -o, sort, map) and `run_job_command`, which hands them to the runner and
exits with its status."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click

from shardflow.cli.common import EXIT_ERROR, one_line_errors, parse_storage_options
from shardflow.tools import runner

# the flags below that only some backends take (runner.backend_options checks them against the backend)
BACKEND_ONLY = ("workers", "address", "wait_workers", "gpus_per_worker")


class BackendChoice(click.Choice):
    """`--backend`: the registry's backends when the command line is parsed (a backend registered after
    this module was imported is a choice too)."""

    def __init__(self) -> None:
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(runner.backend_names())

    @choices.setter
    def choices(self, value: Any) -> None:  # click.Choice.__init__ sets it; the registry decides
        pass


def backend_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where a job runs and how its report is shown: the same flags, with the same meaning, on every
    command that runs a job."""
    options = [
        click.option("--backend", "-b", type=BackendChoice(), default="processes", show_default=True,
                     help="where tasks run: serial (this process, in order), processes (local pool), dask, or a "
                     "backend registered with register_backend"),
        click.option("--workers", "-w", type=click.IntRange(min=1), help="worker processes (default: one per core)"),
        click.option("--address", metavar="URL", help="Dask scheduler address (with --backend dask)"),
        click.option("--wait-workers", type=click.FloatRange(min=0), metavar="SECONDS",
                     help="with --address: give up when no Dask worker has joined after SECONDS (default: wait)"),
        click.option("--gpus-per-worker", type=click.IntRange(min=1), default=None,
                     help="GPUs per worker: processes pins each worker to its own (one worker per slot by default), "
                     "dask asks for the worker resource GPU (docs/gpu.md)"),
        click.option("--force", is_flag=True, help="discard the run directory's progress if it holds a different plan"),
        click.option("--steal", is_flag=True, help="take over the run directory's lease when its driver's has expired"),
        click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: on a terminal)"),
        click.option("--json", "as_json", is_flag=True, help="print the report as JSON instead of text"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def run_job_command(make_job: Callable[[], Any], kw: Mapping[str, Any], *,
                    run_options: Mapping[str, Any] | None = None) -> None:
    """Run the job `make_job()` builds as the backend_flags in `kw` say; exit with the runner's status.

    `kw` holds backend_flags' values and `storage_option`; `run_options`: more driver keywords (run's
    --debug, --limit, --redo, ...)."""
    options = parse_storage_options(kw["storage_option"])
    status = runner.run_and_report(
        make_job, kw["backend"], backend_opts={name: kw[name] for name in BACKEND_ONLY},
        run_options={"force": kw["force"], "progress": kw["progress"], **({"steal": True} if kw["steal"] else {}),
                     **(run_options or {})},
        storage_options=options, as_json=kw["as_json"], echo=click.echo,
        echo_err=lambda line: click.echo(line, err=True),
        guard=lambda: one_line_errors(options, exit_code=EXIT_ERROR, catch=(TypeError,)))
    if status:
        raise SystemExit(status)
