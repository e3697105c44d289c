"""Seeing and trying: `shardflow preview` and the production flags of `shardflow run`.

- `run_flags`: the options `shardflow run` adds for production use: --debug, --limit/--limit-tasks,
  --overwrite, --resume-anyway, --heartbeat (see job.guard, job.trial, job.progress; --redo, the one word
  for "start over", is in running.backend_flags: every command that runs a job has it).
- `preview JOB --inputs SPEC -n 3`: process() on the first samples, in this process, printing what it
  returns (keys, types, shapes, encoded sizes); `--sheet out.png` draws the images as a contact sheet.
  Nothing is written but the sheet.
(`status --watch` is cli/status_watch.py.)
"""

from __future__ import annotations

from typing import Any, Callable

import click

from shardflow.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    Fail,
    job_inputs_option,
    one_line_errors,
    parse_storage_options,
    storage_option_flag,
)
from shardflow.job.progress import DEFAULT_HEARTBEAT_S


def register(group: click.Group) -> None:
    """Add `preview` to the `shardflow` command group."""
    group.add_command(preview_command)


RUN_FLAG_NAMES = ("debug", "limit", "limit_tasks", "overwrite", "redo", "resume_anyway", "heartbeat")


def run_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The production options of `shardflow run` (RUN_FLAG_NAMES; handed to ShardJob.run as keywords)."""
    options = [
        click.option("--debug", is_flag=True, help="run serially in this process with on_error=raise; the first "
                     "failure raises its own exception with its traceback (post-mortem: python -m pdb -m "
                     "shardflow run ... --debug)"),
        click.option("--limit", type=click.IntRange(min=1), metavar="N", help="a trial: the first N samples of "
                     "each task, written to a scratch run (_shardflow-limit-JOB beside the outputs), never to the "
                     "real outputs or run directory"),
        click.option("--limit-tasks", type=click.IntRange(min=1), metavar="K",
                     help="with --limit: only the first K tasks (default: all)"),
        click.option("--overwrite", is_flag=True, help="replace existing shards under the output names that no run "
                     "of this run directory wrote (other files beside the outputs never stop a run)"),
        click.option("--resume-anyway", is_flag=True, help="the job's code changed: keep the finished tasks and run "
                     "the rest with the new code"),
        click.option("--heartbeat", type=click.FloatRange(min=0), default=DEFAULT_HEARTBEAT_S, show_default=True,
                     metavar="SECONDS", help="when stderr is not a terminal: a progress line this often (0: none)"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def flag_values(flags: dict[str, Any]) -> dict[str, Any]:
    """The run_flags values as ShardJob.run keywords (None and False left out)."""
    if flags.get("limit_tasks") and not flags.get("limit"):
        raise click.BadParameter("--limit-tasks needs --limit", param_hint="--limit-tasks")
    if flags.get("redo") and flags.get("resume_anyway"):
        raise click.BadParameter("--redo and --resume-anyway exclude each other", param_hint="--redo")
    return {k: v for k, v in flags.items() if v is not None and v is not False}  # --heartbeat 0 is a value


# ------------------------------------------------------------------------------------------------
# preview


@click.command("preview")
@click.argument("jobfile")
@job_inputs_option("input shards (the first ones are read; repeatable)")
@click.option("-n", "count", type=click.IntRange(min=1), default=3, show_default=True, help="input samples to process")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="override a job option or PARAMS key")
@click.option("--sheet", metavar="PNG", type=click.Path(dir_okay=False), help="also draw the output images as a "
              "contact sheet PNG")
@storage_option_flag()
def preview_command(jobfile: str, inputs: str | list[str] | None, count: int, settings: tuple[str, ...],
                    sheet: str | None, storage_option: tuple[str, ...]) -> None:
    """Run process() on the first samples, in this process, and show what it returns; writes no shards.

    \b
      shardflow preview augment --inputs 'data/train-*.tar' -n 3 --sheet preview.png
    """
    from shardflow.job.jobfile import load_job, parse_overrides
    from shardflow.tools.preview import describe, preview_samples, write_sheet

    options = parse_storage_options(storage_option)
    with one_line_errors(options, exit_code=EXIT_ERROR, catch=(TypeError,)):
        job = load_job(jobfile, inputs=inputs, outputs="<preview>/{task}.tar", overrides=parse_overrides(settings),
                       storage_options=options)
        outputs = preview_samples(job, count)
        for line in describe(outputs, job.make_encoder()):
            click.echo(line)
        if sheet:
            images = write_sheet([o for _, o in outputs], sheet)
            click.echo(f"contact sheet of {images} images: {sheet}" if images else "no images to draw: no sheet")
    if outputs and all(isinstance(result, BaseException) for _, result in outputs):  # shown above, with tracebacks
        raise Fail(f"process() raised on every previewed sample ({len(outputs)} of {len(outputs)})", EXIT_FAILED)

