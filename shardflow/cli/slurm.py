"""`shardflow slurm`: plan a job and print (or submit) the sbatch script of a Slurm job array.

Like `k8s`/`argo`: the job file is loaded, its plan written to the run directory, and the script goes
to stdout (`> job.sbatch`, then `sbatch job.sbatch`); messages go to stderr. With `--submit` the array
and its finalize job are submitted here (a login node) and their ids printed; run again, it resumes.
"""

from __future__ import annotations

from typing import Any

import click

from shardflow.cli.common import EXIT_ERROR, Fail, job_inputs_option, parse_storage_options, storage_option_flag
from shardflow.cli.running import rerun_flags
from shardflow.errors import ShardflowError
from shardflow.storage import options as so


def register(group: click.Group) -> None:
    """Add `slurm` to the `shardflow` command group."""
    group.add_command(slurm_command)


def _pairs(items: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, found, value = item.partition("=")
        if not found or not key:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--env")
        if so.is_secret_name(key):
            raise click.BadParameter(f"{key} looks like a secret: export it in your shell (sbatch passes the "
                                     "environment on) rather than writing it into a script", param_hint="--env")
        out.append((key, value))
    return tuple(out)


@click.command("slurm")
@click.argument("jobfile")
@job_inputs_option()
@click.option("--outputs", "-o", metavar="SPEC", help="output shards or pattern ({task}, {name}, {part})")
@click.option("--run-dir", metavar="URL", help="run directory every node sees [default: _shardflow beside the outputs]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="job option or PARAMS value")
@storage_option_flag()
@click.option("--shared-fs", is_flag=True, help="the local run directory and outputs are on a filesystem every node "
              "mounts at the same path (NFS, Lustre, GPFS... are recognised without it)")
@click.option("--submit", is_flag=True, help="submit the array and its finalize job with sbatch and print their ids "
              "(again: resumes, submitting only the array tasks with work left)")
@click.option("--name", help="job name [default: shardflow-JOBNAME]")
@click.option("--tasks-per-array-task", type=click.IntRange(min=1), default=None,
              help="tasks (input shard groups) per array task [default: 1, more to stay within 1000 array tasks]")
@click.option("--array-parallelism", "-p", type=click.IntRange(min=1), default=None,
              help="array tasks running at once (--array=...%N) [default: as many as Slurm gives]")
@click.option("--partition", help="sbatch --partition")
@click.option("--time", "time_limit", metavar="TIME", help="time limit per array task (sbatch --time, e.g. 4:00:00)")
@click.option("--cpus-per-task", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPUs per array task; also the torch/OpenMP/MKL/OpenBLAS threads of the worker")
@click.option("--mem", help="memory per array task (sbatch --mem, e.g. 8G)")
@click.option("--gpus", type=click.IntRange(min=0), default=0, help="GPUs per array task (docs/gpu.md)")
@click.option("--gpu-flag", type=click.Choice(["gres", "gpus-per-task"]), default="gres", show_default=True,
              help="how GPUs are asked for: --gres=gpu:N or --gpus-per-task=N")
@click.option("--account", help="sbatch --account")
@click.option("--qos", help="sbatch --qos")
@click.option("--constraint", help="sbatch --constraint (node features)")
@click.option("--exclude", help="sbatch --exclude (nodes to avoid)")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPTION[=VALUE]",
              help="any other sbatch option, as an #SBATCH line; repeatable")
@click.option("--setup", multiple=True, metavar="LINE", help="shell line run before the worker (module load ...; "
              "source venv/bin/activate); repeatable")
@click.option("--container", metavar="IMAGE", help="run the worker in IMAGE with pyxis/enroot "
              "(srun --container-image)")
@click.option("--container-mount", "container_mounts", multiple=True, metavar="SRC:DST",
              help="pyxis --container-mounts entry (the shared filesystem, for a local run directory); repeatable")
@click.option("--command", "worker_command", default="shardflow", show_default=True,
              help="how a node starts shardflow (e.g. '/shared/venv/bin/python -m shardflow')")
@click.option("--log-dir", metavar="DIR", help="folder of the array tasks' logs [default: the submit directory]")
@click.option("--retries", type=click.IntRange(min=0), default=None,
              help="retries per array task of transient failures (exit 75, a killed worker) [default: the job's "
              "io_retries + 1, so that a task that kills its process is recorded failed, naming its shard]")
@click.option("--signal-seconds", type=click.IntRange(min=0), default=90, show_default=True,
              help="Slurm sends USR1 this long before the time limit: the worker stops cleanly and requeues (0: no)")
@click.option("--env", multiple=True, metavar="NAME=VALUE", help="variable exported by the script (no secrets)")
@click.option("--no-prepare", is_flag=True, help="write nothing to the run directory (tasks counted from the inputs "
              "spec); write the plan first with `shardflow worker --prepare`")
@click.option("--redo", "--force", "force", is_flag=True, help="start over: replace a different plan in the run "
              "directory (--force is the older name)")
@click.option("--extend", is_flag=True, help="the inputs grew: add the new ones to the run directory's plan as new "
              "tasks after its own, and count them in the array (job.extend)")
@click.option("--retry-failed", is_flag=True, help="the finished tasks that dropped samples run again: their markers "
              "are forgotten when the plan is written, so their array tasks redo them (rundir.retry)")
def slurm_command(jobfile: str, inputs: str | list[str] | None, outputs: str | None, run_dir: str | None,
                  overrides: tuple[str, ...], storage_option: tuple[str, ...], shared_fs: bool, submit: bool,
                  no_prepare: bool, force: bool, extend: bool, retry_failed: bool, time_limit: str | None,
                  worker_command: str,
                  env: tuple[str, ...], **kw: Any) -> None:
    """Plan JOBFILE and print the sbatch script of a Slurm job array running it (or --submit it)."""
    from shardflow.cluster.slurm import from_job, render
    from shardflow.job.jobfile import load_job, parse_overrides

    if submit and no_prepare:
        raise click.UsageError("--submit writes the plan first: drop --no-prepare")
    options = parse_storage_options(storage_option)
    rerun = rerun_flags(redo=force, extend=extend, retry_failed=retry_failed, no_prepare=no_prepare)
    try:
        job = load_job(jobfile, inputs=inputs, outputs=outputs, overrides=parse_overrides(overrides),
                       run_dir=run_dir, storage_options=options)
        settings = {k: v for k, v in kw.items() if v not in (None, ())}  # not given: SlurmOptions' default
        opts = from_job(job, prepare=not no_prepare, rerun=rerun, shared_fs=shared_fs, time=time_limit,
                        command=worker_command, env=_pairs(env), **settings)
        text = render(opts)
        where = "nothing written (--no-prepare)" if no_prepare else f"plan written to {opts.run_dir}"
        click.echo(f"shardflow: {opts.tasks} tasks, {opts.array_tasks} array tasks of {opts.per_array_task} "
                   f"task(s); {where}", err=True)
        if not submit:
            click.echo(text, nl=False)
            return
        from shardflow.cluster.slurm.submit import resume

        submission = resume(job, opts)
    except (ShardflowError, ValueError) as exc:
        raise Fail(so.scrub(str(exc), options), EXIT_ERROR) from None
    except KeyError as exc:  # a ${VAR} storage option whose variable is not set here
        raise Fail(str(exc.args[0]) if exc.args else repr(exc), EXIT_ERROR) from None
    click.echo(f"shardflow: submitted {submission}", err=True)
    click.echo(" ".join(submission.job_ids))
