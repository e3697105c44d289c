"""`shardflow report RUN_DIR -o report.html`: the report page of a run (tools/report_page), or --json."""

from __future__ import annotations

import json
from typing import Any

import click

from shardflow.cli.common import EXIT_ERROR, EXIT_FAILED, one_line_errors, parse_storage_options, storage_option_flag
from shardflow.cli.tools_common import refuse_input_as_output
from shardflow.storage import options as so
from shardflow.text import safe
from shardflow.tools.runner import STDOUT


def register(group: click.Group) -> None:
    group.add_command(report_command)


@click.command("report")
@click.argument("run_dir")
@click.option("--output", "-o", help="where to write the page (any store; '-': standard output); default: "
              "report.html in RUN_DIR")
@click.option("--json", "as_json", is_flag=True, help="the page's numbers as JSON (to -o, else to stdout)")
@click.option("--samples", "-n", type=click.IntRange(min=0), default=6, show_default=True,
              help="samples on the before/after sheet (0: none)")
@storage_option_flag(help="fsspec storage option for the run directory, its shards and -o (repeatable)")
def report_command(run_dir: str, output: str | None, as_json: bool, samples: int,
                   storage_option: tuple[str, ...]) -> None:
    """One self-contained HTML page about a run, from its run directory (during or after the run).

    Summary (samples in/out/dropped/failed, bytes, wall and CPU time, settings, code fingerprint,
    version), throughput and tasks running over time, task durations with the slowest tasks, per
    worker and host throughput, failures grouped by kind and by error with tracebacks, dropped samples
    by reason, and a before/after sheet of a few samples. The page needs no network to open.

    Exit status: 0 written, 1 the page could not be made or written, 2 RUN_DIR holds no run (no
    plan.json) or cannot be read, as for `shardflow status`.

    \b
      shardflow report out/_shardflow -o report.html
      shardflow report out/_shardflow -o - > report.html
      shardflow report s3://bucket/out/_shardflow --json | jq .summary
    """
    from shardflow.rundir.run_dir import RunDir
    from shardflow.tools import report_page

    options = parse_storage_options(storage_option)
    run_options = so.options_for(run_dir, options) if options else None
    with one_line_errors(options, exit_code=EXIT_ERROR):  # no run directory to report on: 2, as `status`
        RunDir(run_dir, run_options).load_plan()
    with one_line_errors(options, exit_code=EXIT_FAILED, broken_pipe_ok=output == STDOUT or output is None):
        if as_json and output in (None, STDOUT):
            from shardflow.tools.report_data import collect

            click.echo(json.dumps(collect(run_dir, run_options), indent=1, sort_keys=True))
            return
        if output == STDOUT:  # `-` is standard output here as for every command (tools.runner.STDOUT)
            click.echo(report_page.build(run_dir, run_options, samples=samples)[1])
            return
        target = output or run_dir.rstrip("/") + "/report.html"
        if output is not None:
            refuse_input_as_output(output, _read_by_report(run_dir, run_options))
        data = report_page.write(run_dir, target, run_options, as_json=as_json, samples=samples,
                                 output_options=so.options_for(target, options) if options else None)
    s = data["summary"]
    click.echo(f"report of {s['done']}/{s['tasks']} tasks done, {s['failed']} failed: {safe(target)}", err=True)


def _read_by_report(run_dir: str, options: dict[str, Any] | None) -> list[str]:
    """What the page is made from and about, which -o must not replace: the run directory's plan and every
    task's input and output shards (the sample sheet reads some). Nothing when there is no plan to read
    (the report then says why it cannot be made)."""
    from shardflow.rundir.layout import PLAN
    from shardflow.rundir.run_dir import RunDir
    from shardflow.storage.paths import join

    rundir = RunDir(run_dir, options)
    try:
        plan = rundir.read_json(PLAN)
    except (OSError, ValueError):
        return []
    shards = [join(run_dir, PLAN)]
    for task in rundir.load_tasks(plan, range(rundir.task_count(plan))):
        shards.extend((*task.inputs, task.output))
    return shards
