"""`shardflow run`, `plan`, `status`, `jobs` and `demo`: run job files from the command line.

`shardflow run` runs through the one runner of every command that runs a job (cli/running.py,
tools/runner.py), which also decides its exit status (and what a script or an orchestrator should do):

    0    every task of the plan is done (samples dropped as failed are said in one line on stderr)
    1    the run ended with tasks failed or not done (they are listed; rerun the same command to retry)
    2    the job could not start: a bad job file, --set, spec or option, a refused plan, a held lease
    130  interrupted (Ctrl-C / SIGINT / SIGTERM): finished tasks stay done, rerun to resume

Every failure is one line on stderr (`shardflow: error: ...`), never a traceback, with credentials
scrubbed from it.
"""

from __future__ import annotations

import json
from typing import Any

import click

from shardflow.cli.common import (
    EXIT_ERROR,
    job_inputs_option,
    one_line_errors,
    parse_storage_options,
    setting_option,
    storage_option_flag,
)
from shardflow.cli.locations import location_flags
from shardflow.cli.running import backend_flags, run_job_command
from shardflow.cli.trying import RUN_FLAG_NAMES, flag_values, run_flags
from shardflow.errors import ShardflowError
from shardflow.rundir.layout import PLAN
from shardflow.storage import options as so
from shardflow.text import safe


def register(group: click.Group) -> None:
    """Add `run`, `plan`, `status`, `jobs` and `demo` to the `shardflow` command group."""
    for command in (run_command, plan_command, status_command, jobs_command, demo_command):
        group.add_command(command)


# ------------------------------------------------------------------------------------------------
# shared plumbing


def _errors(options: dict[str, Any] | None = None) -> Any:
    """Failures before or around a run: one line, exit status 2; Ctrl-C: 130."""
    return one_line_errors(options, exit_code=EXIT_ERROR, catch=(TypeError,))


def _job_options(fn: Any) -> Any:
    """The options every command that loads a job file shares."""
    options = [
        job_inputs_option(),
        click.option("--outputs", "-o", metavar="SPEC",
                     help="output shards: one per task (same count as the tasks), or a pattern with "
                     "{task}, {name} (input shard name) and {part} (rollover part)"),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="override a ShardJob option (maxcount, decode, on_error, seed, ...) or a PARAMS "
                     "key of the job file (repeatable; values are JSON when they parse as JSON)"),
        setting_option("run_dir", metavar="URL"),
        storage_option_flag(),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _load(jobfile: str, inputs: str | list[str] | None, outputs: str | None, settings: tuple[str, ...],
          run_dir: str | None, storage_options: dict[str, Any] | None) -> Any:
    from shardflow.job.jobfile import load_job, parse_overrides

    return load_job(jobfile, inputs=inputs, outputs=outputs, overrides=parse_overrides(settings),
                    run_dir=run_dir, storage_options=storage_options)


# ------------------------------------------------------------------------------------------------
# run


@click.command("run")
@location_flags
@click.argument("jobfile")
@_job_options
@backend_flags
@run_flags
def run_command(jobfile: str, inputs: str | list[str] | None, outputs: str | None, settings: tuple[str, ...],
                run_dir: str | None, **kw: Any) -> None:
    """Run a job file over input shards into output shards, resuming where an earlier run stopped.

    JOBFILE is a job file (jobs/augment.py) or the name of a built-in job (augment, resize, filter,
    reshard: see `shardflow jobs`).

    \b
      shardflow run augment --inputs 'data/train-{000000..000099}.tar' --outputs 'aug/{name}.tar'
      shardflow run jobs/resize.py -i 's3://b/in-*.tar' --outputs 's3://b/out/{name}.tar' --set size=256

    Exit status (the same for split, cat -o, sort, map): 0 all tasks done (samples dropped as failed
    said on stderr), 1 some tasks failed or not done (listed), 2 the job could not start, 130
    interrupted (rerun the same command to resume).
    """
    run_options = flag_values({name: kw.pop(name) for name in RUN_FLAG_NAMES})
    options = parse_storage_options(kw["storage_option"])
    run_job_command(lambda: _load(jobfile, inputs, outputs, settings, run_dir, options), kw, run_options=run_options)


# ------------------------------------------------------------------------------------------------
# plan


@click.command("plan")
@location_flags
@click.argument("jobfile")
@_job_options
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="tasks to list (0: all)")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan_command(jobfile: str, inputs: str | list[str] | None, outputs: str | None, settings: tuple[str, ...],
                 run_dir: str | None, storage_option: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Show the tasks a run would execute, without running or writing anything.

    Also says what the run directory already holds: the same plan (and how far it got), a
    different plan (a run would be refused without --redo), or nothing yet.
    """
    from shardflow.job.fingerprint import code_fingerprint, same_code
    from shardflow.job.jobfile import job_from_file, load_job_file, parse_overrides
    from shardflow.rundir.run_dir import plan_fingerprint

    options = parse_storage_options(storage_option)
    with _errors(options):
        loaded = load_job_file(jobfile)
        job = job_from_file(loaded, inputs=inputs, outputs=outputs, overrides=parse_overrides(settings),
                            run_dir=run_dir, storage_options=options)
        tasks = job.plan()
        task_json = [t.to_json() for t in tasks]
        rundir = job.rundir()
        state = "empty"
        done: set[int] = set()
        if rundir.exists(PLAN):
            held = rundir.read_json(PLAN)
            same = held.get("fingerprint") == plan_fingerprint(task_json, job.settings())
            state = "same" if same else "different"
            if same:
                done = rundir.done_ids()
                code = held.get("code") or {}
                state = "same" if code.get("fingerprint") is None or same_code(code, code_fingerprint(job)) else "code"
    if as_json:
        click.echo(json.dumps({
            "job": job.describe(), "job_file": str(loaded.path), "params": loaded.params, "run_dir": job.run_dir,
            "run_dir_state": state, "done": sorted(done), "tasks": so.redact_urls_deep(task_json),
        }, indent=1, sort_keys=True, default=repr))
        return
    click.echo(f"job {job.name} ({loaded.path}){': ' + loaded.summary() if loaded.summary() else ''}")
    described = {k: v for k, v in job.describe().items() if k not in ("name", "fn", "params") and v is not None}
    click.echo("options: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in described.items()))
    if loaded.params is not None:
        click.echo("params: " + ", ".join(f"{k}={json.dumps(v, default=repr)}" for k, v in loaded.params.items()))
    ninputs = sum(len(t.inputs) for t in tasks)
    click.echo(f"{len(tasks)} tasks over {ninputs} input shards; run directory {job.run_dir}")
    if state == "same":
        click.echo(f"the run directory holds this plan: {len(done)} of {len(tasks)} tasks done")
    elif state == "code":
        click.echo(f"the run directory holds this plan ({len(done)} of {len(tasks)} tasks done) made by OTHER code: "
                   "`shardflow run` asks for --redo (every task again) or --resume-anyway (keep those done)")
    elif state == "different":
        click.echo("the run directory holds a DIFFERENT plan: `shardflow run` refuses it unless given --redo "
                   "(which discards that progress) or, where inputs were only added, --extend (which adds them as new "
                   "tasks); or use another --run-dir")
    shown = tasks if limit == 0 else tasks[:limit]
    for task in shown:
        mark = " [done]" if task.id in done else ""
        inputs_text = task.inputs[0] if len(task.inputs) == 1 else f"{task.inputs[0]} ... ({len(task.inputs)} shards)"
        click.echo(safe(so.redact_urls(f"  task {task.id:>6}: {inputs_text} -> {task.output}{mark}"), None))
    if len(shown) < len(tasks):
        click.echo(f"  ... {len(tasks) - len(shown)} more (--limit 0 lists all)")
    if tasks:
        click.echo(f"rollover parts of a task are named like {tasks[0].output_parts.format(part=1)}")


# ------------------------------------------------------------------------------------------------
# status


@click.command("status")
@click.argument("run_dir")
@click.option("--errors", "nerrors", type=click.IntRange(min=0), default=5, show_default=True,
              help="dropped samples and failed tasks to show")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@storage_option_flag(help="fsspec storage option for the run directory (repeatable)")
@click.option("--watch", is_flag=True, help="redraw every --interval seconds until the run is complete (Ctrl-C ends)")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="seconds (--watch)")
@click.option("--check", is_flag=True, help="exit 1 unless every task is done (not only when a task failed)")
def status_command(run_dir: str, nerrors: int, as_json: bool, storage_option: tuple[str, ...], watch: bool,
                   interval: float, check: bool) -> None:
    """How far a run got, from its run directory alone (the outputs are not read).

    Tasks done / failed / running / pending, samples in and out, the rate and ETA, the running tasks
    with their worker and age, the sample errors by type and the last failures. Works while a run is
    going on, from any machine that can read the run directory. --watch polls until no task is left
    to run, printing each failure as it happens, or until the run's driver is gone (killed on this
    host, or its lease expired: exit 1).

    Exit status: 0 no task failed, 1 a task failed (with --check: or a task is not done yet),
    2 the run directory cannot be read.
    """
    from shardflow.cli.status_watch import exit_code
    from shardflow.cli.status_watch import watch as watch_until_ended
    from shardflow.rundir.status import read_status

    options = parse_storage_options(storage_option)
    run_options = so.options_for(run_dir, options) if options else None
    if watch:
        with _errors(options):
            raise SystemExit(watch_until_ended(lambda: read_status(run_dir, run_options, examples=nerrors), interval,
                                               check=check))
    with _errors(options):
        status = read_status(run_dir, run_options, examples=nerrors)
    if as_json:
        click.echo(json.dumps(status.to_json(), indent=1, sort_keys=True))
    else:
        click.echo(so.scrub(str(status), options))
    raise SystemExit(exit_code(status, check=check))


# ------------------------------------------------------------------------------------------------
# jobs


@click.command("jobs")
def jobs_command() -> None:
    """List the built-in jobs (`shardflow run NAME`), with the file each one loads."""
    from shardflow.job.jobfile import builtin_jobs, job_summary

    for name, path in builtin_jobs().items():
        try:
            summary = job_summary(path)
        except ShardflowError as exc:
            summary = f"(cannot load: {exc})"
        click.echo(f"{name:10} {summary}\n{'':10} {path}")


# ------------------------------------------------------------------------------------------------
# demo


@click.command("demo")
@click.option("--dir", "directory", default="shardflow-demo", show_default=True, type=click.Path(file_okay=False),
              help="where to write the input shards, the outputs and the run directory")
@click.option("--samples", type=click.IntRange(min=1), default=256, show_default=True, help="samples in all")
@click.option("--shards", type=click.IntRange(min=1), default=4, show_default=True, help="input shards")
@click.option("--workers", "-w", type=click.IntRange(min=1), help="worker processes (default: one per core)")
def demo_command(directory: str, samples: int, shards: int, workers: int | None) -> None:
    """Make a small synthetic image dataset and run the built-in augment job on it.

    Writes SHARDS tar shards of 512x384 JPEG + json (with a label) under DIR/input, runs
    the built-in augment job (decode, flip, noise, png + cls) with the local processes backend into
    DIR/augmented, prints the report and reads a few results back. Without torch (the core install)
    it runs the built-in resize job (Pillow) into DIR/resized instead, and says so.
    """
    from shardflow.tools.demo import run_demo
    from shardflow.tools.runner import outcome

    with _errors():
        report = run_demo(directory, samples=samples, workers=workers, shards=shards, echo=click.echo)
    status, message = outcome(report)
    if message:
        click.echo(message, err=True)
    if status:
        raise SystemExit(status)
