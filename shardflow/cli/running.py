"""The click side of the one runner (shardflow/tools/runner.py): the flags of every command that runs a
job (`shardflow run`, split, cat -o, sort, map) and `run_job_command`, which hands them to the runner and
exits with its status."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click

from shardflow.cli.common import EXIT_ERROR, one_line_errors, parse_storage_options, setting_option
from shardflow.errors import JobError
from shardflow.job.rerun import Rerun
from shardflow.tools import runner

# the flags below that only some backends take (runner.backend_options checks them against the backend)
BACKEND_ONLY = ("workers", "address", "wait_workers", "gpus_per_worker", "ray_args")


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
                     help="where tasks run: serial (this process, in order), processes (local pool), dask, ray, or a "
                     "backend registered with register_backend"),
        click.option("--workers", "-w", type=click.IntRange(min=1), help="worker processes (default: one per core)"),
        click.option("--address", metavar="URL", help="Dask scheduler address (with --backend dask); Ray cluster "
                     "address (with --backend ray: auto, HOST:PORT or ray://HOST:10001)"),
        click.option("--ray-arg", "ray_args", multiple=True, metavar="KEY=VALUE",
                     callback=lambda ctx, param, value: value or None,
                     help="with --backend ray: an option of each Ray task (num_cpus=2, memory=4e9, resources={ssd: 1}, "
                     "runtime_env={working_dir: .}), value read as YAML; repeatable (docs/ray.md)"),
        click.option("--wait-workers", type=click.FloatRange(min=0), metavar="SECONDS",
                     help="with --address: give up when no Dask worker has joined after SECONDS (default: wait)"),
        click.option("--gpus-per-worker", type=click.IntRange(min=1), default=None,
                     help="GPUs per worker: processes pins each worker to its own (one worker per slot by default), "
                     "dask asks for the worker resource GPU (docs/gpu.md)"),
        click.option("--redo", is_flag=True, help="start over: discard the run directory's progress (it holds a "
                     "different plan, or the job's code changed) and run every task again into fresh outputs"),
        click.option("--extend", is_flag=True, help="the inputs grew: plan the inputs no stored task has as new tasks "
                     "after the run directory's plan and run them (with any unfinished ones); finished tasks stay "
                     "done. Only adds: a stored task's input that is gone is refused; safe to pass on every run"),
        click.option("--retry-failed", is_flag=True, help="run again the finished tasks that dropped samples "
                     "(on_error skip: their function raised, a decode failed; not SkipSample), with the unfinished "
                     "ones: fix the cause first; their outputs and errors/ are written again"),
        click.option("--force", is_flag=True, hidden=True, help="deprecated: the same as --redo"),
        click.option("--steal", is_flag=True, help="take over the run directory's lease when its driver's has expired"),
        setting_option("retry_budget", metavar="SECONDS", type=click.FloatRange(min=0)),
        click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: on a terminal)"),
        click.option("--json", "as_json", is_flag=True, help="print the report as JSON instead of text"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def rerun_flags(*, redo: bool = False, extend: bool = False, retry_failed: bool = False,
                no_prepare: bool = False) -> Rerun:
    """The Rerun (job.rerun: the one owner of which choices exclude each other) a command's flags ask for;
    a contradiction is a usage error (exit 2) before anything runs. `no_prepare`: the command writes no
    plan, which --extend and --retry-failed act on."""
    try:
        rerun = Rerun.of(redo=redo, extend=extend, retry_failed=retry_failed)
    except JobError as exc:
        raise click.UsageError(str(exc)) from None
    if no_prepare and (extend or retry_failed):
        raise click.UsageError("--extend and --retry-failed change the plan or progress in the run directory, which "
                               "--no-prepare does not write: drop one of them (in the cluster: shardflow worker "
                               "--prepare JOBFILE --extend / --retry-failed)")
    return rerun


def run_job_command(make_job: Callable[[], Any], kw: Mapping[str, Any], *,
                    run_options: Mapping[str, Any] | None = None) -> None:
    """Run the job `make_job()` builds as the backend_flags in `kw` say; exit with the runner's status.

    `kw` holds backend_flags' values and `storage_option`; `run_options`: more driver keywords (run's
    --debug, --limit, --redo, ...)."""
    options = parse_storage_options(kw["storage_option"])
    if kw["force"]:
        click.echo("shardflow: warning: --force is deprecated: it is the same as --redo (start over)", err=True)
    rerun_flags(redo=bool(kw.get("redo") or kw["force"] or (run_options or {}).get("redo")),
                extend=bool(kw.get("extend")), retry_failed=bool(kw.get("retry_failed")))  # usage errors first
    chosen = {name: True for name in ("redo", "overwrite", "retry_failed", "extend")
              if kw.get(name)}  # (run pops redo, overwrite into run_options)
    budget = kw.get("retry_budget")
    make = make_job if budget is None else (lambda: make_job().replace(retry_budget=budget))
    status = runner.run_and_report(
        make, kw["backend"], backend_opts={name: kw[name] for name in BACKEND_ONLY},
        run_options={"redo": kw["force"], "progress": kw["progress"], **({"steal": True} if kw["steal"] else {}),
                     **chosen, **(run_options or {})},
        storage_options=options, as_json=kw["as_json"], echo=click.echo,
        echo_err=lambda line: click.echo(line, err=True),
        guard=lambda: one_line_errors(options, exit_code=EXIT_ERROR, catch=(TypeError,)))
    if status:
        raise SystemExit(status)
