"""What the shell tools (create, split, cat -o, head, sort, tsv, show, map) share: options, running
their job on a backend with the report and exit codes of `shardflow run`, and terminal-safe text.

Exit codes as `shardflow run`: 0 done (failed samples are left out, logged and counted on stderr), 1 some
tasks failed,
2 the tool could not start (bad spec, option, refused plan), 130 interrupted (rerun to resume).
"""

from __future__ import annotations

import json
import signal
from typing import Any, Callable

import click

from shardflow.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    STORAGE_OPTION_HELP,
    one_line_errors,
    parse_storage_options,
)
from shardflow.storage import options as so
from shardflow.storage.specs import expand
from shardflow.text import escape

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {ord("\\"): "\\\\"}
_CONTROL.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})


def printable(text: Any) -> str:
    """`text` safe to print on a terminal (shardflow.text.escape: controls, newlines, C1, lone surrogates of
    non-UTF-8 names escaped), so data can never move the cursor, retitle the window or fake lines."""
    return escape(str(text))


def storage_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--storage-option/-S KEY=VALUE` (the CLI convention: `-o` is always the output)."""
    return click.option("--storage-option", "-S", "storage_option", multiple=True, metavar="KEY=VALUE",
                        help=STORAGE_OPTION_HELP)(fn)


def allow_pipe_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--allow-pipe", is_flag=True, help="allow pipe:CMD URLs (they run shell commands)")(fn)


def backend_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a tool that runs as a job: where it runs, its run directory, resuming, output."""
    options = [
        click.option("--backend", "-b", type=click.Choice(["serial", "processes", "dask"]), default="processes",
                     show_default=True, help="where tasks run: serial, processes (local pool), dask"),
        click.option("--workers", "-w", type=click.IntRange(min=1), help="worker processes (default: one per core)"),
        click.option("--address", metavar="URL", help="Dask scheduler address (with --backend dask)"),
        click.option("--run-dir", metavar="URL", help="run directory (default: _shardflow beside the outputs)"),
        click.option("--on-error", type=click.Choice(["raise", "skip", "warn"]), default="skip", show_default=True,
                     help="a bad sample: stop the task (raise), or drop it and log it in the run directory"),
        click.option("--force", is_flag=True, help="discard the run directory's progress if it holds another plan"),
        click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: on a terminal)"),
        click.option("--json", "as_json", is_flag=True, help="print the report as JSON"),
        storage_option,
        allow_pipe_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def job_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """ShardJob keywords from the shared options (run_dir, on_error, storage_options, allow_pipe)."""
    return dict(run_dir=kw["run_dir"], on_error=kw["on_error"], allow_pipe=kw["allow_pipe"],
                storage_options=parse_storage_options(kw["storage_option"]))


def run_tool_job(make_job: Callable[[], Any], kw: dict[str, Any]) -> None:
    """Build the job, run it on the chosen backend, print the report, exit like `shardflow run`."""
    options = parse_storage_options(kw["storage_option"])
    if kw["address"] is not None and kw["backend"] != "dask":
        raise click.BadParameter("--address is for --backend dask", param_hint="--address")
    backend = {k: kw[k] for k in ("workers", "address") if kw[k] is not None}
    previous = _sigterm_as_interrupt()
    try:
        with one_line_errors(options, exit_code=EXIT_ERROR, catch=(TypeError,)):
            job = make_job()
            report = job.run(kw["backend"], force=kw["force"], progress=kw["progress"], **backend)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if kw["as_json"]:
        click.echo(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        click.echo("\n".join(printable(line) for line in so.scrub(str(report), options).split("\n")))
    if report.interrupted:
        click.echo("shardflow: interrupted; run the same command again to resume", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    status = f"`shardflow status {printable(report.run_dir)}`"
    if report.failed or not report.ok:
        click.echo(f"shardflow: {len(report.failed)} of {report.tasks} tasks failed; see {status}, fix the cause "
                   "and run the same command again", err=True)
        raise SystemExit(EXIT_FAILED)
    if report.stats.failed:  # the tasks finished without some samples: said, and exit 0 as `shardflow run`
        click.echo(f"shardflow: {report.stats.failed} samples failed and were left out; see {status}", err=True)


def _sigterm_as_interrupt() -> Any:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return signal.getsignal(signal.SIGTERM)


def progress_bar(enabled: bool | None, total: int | None, unit: str) -> Any:
    """A tqdm bar on stderr (default: when stderr is a terminal)."""
    import sys

    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=not (sys.stderr.isatty() if enabled is None else enabled),
                dynamic_ncols=True)


progress_option = click.option("--progress/--no-progress", default=None,
                               help="progress bar on stderr (default: on a terminal)")


def expand_all(specs: tuple[str, ...] | list[str], options: dict[str, Any] | None) -> list[str]:
    """Every shard URL the specs name, in order."""
    urls: list[str] = []
    for spec in specs:
        urls.extend(expand(spec, so.options_for(spec, options)))
    return urls
