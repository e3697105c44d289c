"""`shardflow worker`, `shardflow k8s`, `shardflow argo`: running a planned job on a cluster.

`k8s`/`argo` load a job file, write its plan to the run directory and print a manifest on stdout
(`| kubectl create -f -`); messages go to stderr. `worker` is what the pods run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from shardflow.cli.common import EXIT_ERROR, Fail, job_inputs_option, parse_storage_options, storage_option_flag
from shardflow.cli.running import rerun_flags
from shardflow.cluster.contract import EXIT_CODES, EXIT_STOP, INDEX_ENV
from shardflow.errors import ShardflowError
from shardflow.storage import options as so
from shardflow.text import safe as printable

_EXIT_HELP = "; ".join(f"{code}: {what}" for code, what in EXIT_CODES.items())


def register(group: click.Group) -> None:
    """Add `worker`, `k8s` and `argo` to the `shardflow` command group."""
    group.add_command(worker_command)
    group.add_command(k8s_command)
    group.add_command(argo_command)


_storage_option = storage_option_flag()


# ------------------------------------------------------------------------------------------------
# worker


@click.command("worker", epilog=f"Exit status: {_EXIT_HELP}.")
@click.option("--run-dir", required=True, metavar="URL", help="run directory holding plan.json and job.pkl")
@click.option("--index", type=int, default=None,
              help=f"chunk index (default: ${INDEX_ENV}, set by Kubernetes Indexed Jobs)")
@click.option("--tasks-per-index", type=click.IntRange(min=1), default=1, show_default=True,
              help="tasks per chunk: index I runs task ids [I*K, (I+1)*K)")
@click.option("--finalize", is_flag=True, help="rebuild summary.json from the completion markers instead; "
              "exit 0 when every task is done, 65 when the run is incomplete")
@click.option("--prepare", "prepare_job", metavar="JOBFILE", default=None,
              help="write the plan of JOBFILE (with --inputs/--outputs/--set) to the run directory instead, from "
              "inside the cluster (for manifests rendered with --no-prepare); exit 0 written, 75 unreachable, 78 bad")
@job_inputs_option("with --prepare: input shards (repeatable)")
@click.option("--outputs", "-o", metavar="SPEC", help="with --prepare: output shards or pattern")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="with --prepare: job option or PARAMS")
@click.option("--redo", "--force", "force", is_flag=True, help="with --prepare: start over (replace a different plan; "
              "--force is the older name)")
@click.option("--extend", is_flag=True, help="with --prepare: add the new inputs to the plan as new tasks (job.extend)")
@click.option("--retry-failed", is_flag=True, help="with --prepare: the finished tasks that dropped samples run again "
              "(rundir.retry): the pods of their indexes redo them")
@click.option("--report", "report_to", metavar="URL", default=None,
              help="with --finalize: also write the report page there (`shardflow report`; e.g. RUN_DIR/report.html)")
@_storage_option
def worker_command(run_dir: str, index: int | None, tasks_per_index: int, finalize: bool, prepare_job: str | None,
                   inputs: str | list[str] | None, outputs: str | None, overrides: tuple[str, ...], force: bool,
                   extend: bool, retry_failed: bool, report_to: str | None, storage_option: tuple[str, ...]) -> None:
    """Run the tasks of one chunk of a planned job (what each pod runs), idempotently."""
    from shardflow.cluster import worker

    options = parse_storage_options(storage_option)
    if prepare_job is not None:
        from shardflow.cluster.prepare import prepare_in_cluster
        from shardflow.job.jobfile import parse_overrides

        sys.exit(prepare_in_cluster(prepare_job, run_dir, inputs=inputs, outputs=outputs,
                                    overrides=parse_overrides(overrides), storage_options=options,
                                    rerun=rerun_flags(redo=force, extend=extend, retry_failed=retry_failed)))
    if finalize:
        code = worker.finalize(run_dir, storage_options=options)
        if report_to is not None:  # the page is a view: failing to draw it never fails the finalize step
            from shardflow.tools import report_page

            try:
                report_page.write(run_dir, report_to, so.options_for(run_dir, options) if options else None,
                                  output_options=so.options_for(report_to, options) if options else None)
                click.echo(f"report page: {printable(report_to)}")
            except Exception as exc:  # noqa: BLE001
                click.echo(f"shardflow worker --finalize: no report page: {type(exc).__name__}: "
                           f"{so.scrub(printable(str(exc)), options)}", err=True)
        sys.exit(code)
    if index is None:
        text = os.environ.get(INDEX_ENV)
        if text is None:
            raise click.UsageError(f"give --index, or set ${INDEX_ENV}")
        try:
            index = int(text)
        except ValueError:
            click.echo(f"shardflow worker: ${INDEX_ENV}={text!r} is not an integer", err=True)
            sys.exit(EXIT_STOP)
    sys.exit(worker.run_chunk(run_dir, index, tasks_per_index, storage_options=options))


# ------------------------------------------------------------------------------------------------
# k8s / argo


def _pairs(items: tuple[str, ...], flag: str, sep: str = "=") -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key:
            raise click.BadParameter(f"{item!r} is not KEY{sep}VALUE", param_hint=flag)
        out.append((key, value))
    return out


def _cluster_options(fn):
    options = [
        click.argument("jobfile"),
        job_inputs_option(),
        click.option("--outputs", "-o", metavar="SPEC", help="output shards or pattern ({task}, {name}, {part})"),
        click.option("--run-dir", metavar="URL", help="run directory the pods share [default: _shardflow beside "
                     "the outputs]"),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="job option or PARAMS value"),
        _storage_option,
        click.option("--image", required=True, help="worker image (see docker/Dockerfile)"),
        click.option("--name", help="Job / Workflow name [default: shardflow-JOBNAME]"),
        click.option("--namespace", "-n", help="namespace"),
        click.option("--parallelism", "-p", type=click.IntRange(min=1), default=16, show_default=True,
                     help="pods at a time"),
        click.option("--tasks-per-pod", type=click.IntRange(min=1), default=None,
                     help="tasks (input shard groups) per pod [default: 1, more when there are very many tasks]"),
        click.option("--cpu", default="1", show_default=True, help="CPU request per pod"),
        click.option("--memory", default="2Gi", show_default=True, help="memory request and limit per pod"),
        click.option("--gpus", type=click.IntRange(min=0), default=0, help="nvidia.com/gpu per pod (docs/gpu.md)"),
        click.option("--secret", "secrets", multiple=True, metavar="NAME",
                     help="Kubernetes Secret whose keys become env vars (AWS_ACCESS_KEY_ID, ...); repeatable"),
        click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="plain env var (no secrets)"),
        click.option("--service-account", help="service account of the pods (IRSA / workload identity; Argo: it "
                     "also needs workflowtaskresults create/patch, see docs/kubernetes.md)"),
        click.option("--image-pull-secret", "pull_secrets", multiple=True, metavar="NAME"),
        click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="schedule on nodes with this label"),
        click.option("--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE][:EFFECT]",
                     help="tolerate a taint (kubectl taint syntax; no VALUE: any value); repeatable"),
        click.option("--affinity", metavar="FILE", help="pod affinity from a YAML/JSON file"),
        click.option("--priority-class", metavar="NAME", help="PriorityClass of the pods"),
        click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
                     help="label on the Job/Workflow and pods"),
        click.option("--annotation", "annotations", multiple=True, metavar="KEY=VALUE",
                     help="annotation on the Job/Workflow and pods"),
        click.option("--secret-file", "secret_files", multiple=True, metavar="NAME:PATH",
                     help="mount Secret NAME read-only as files under PATH (GCS key files, ...); repeatable"),
        click.option("--pvc", multiple=True, metavar="CLAIM:PATH", help="mount a PersistentVolumeClaim"),
        click.option("--retries", type=click.IntRange(min=0), default=None,
                     help="retries per index (transient failures) [default: the job's io_retries + 1, so that a "
                     "task that kills its pod is recorded failed, naming its shard]"),
        click.option("--ttl", type=click.IntRange(min=0), default=86400, show_default=True,
                     help="seconds a finished run's objects are kept"),
        click.option("--deadline", type=click.IntRange(min=1), default=None, help="activeDeadlineSeconds"),
        click.option("--tmp-size", default="1Gi", show_default=True, help="size of the /tmp emptyDir"),
        click.option("--no-prepare", is_flag=True, help="write nothing to the run directory (tasks counted "
                     "from the inputs spec); the plan must be written before the pods start, e.g. by "
                     "`shardflow worker --prepare` in the cluster (where only the cluster can write the bucket)"),
        click.option("--redo", "--force", "force", is_flag=True, help="start over: replace a different plan in the run "
                     "directory (--force is the older name)"),
        click.option("--extend", is_flag=True, help="the inputs grew: add the new ones to the run directory's plan as "
                     "new tasks after its own, and count them in the manifest (job.extend)"),
        click.option("--retry-failed", is_flag=True, help="the finished tasks that dropped samples run again: their "
                     "markers are forgotten when the plan is written, so their pods redo them (rundir.retry)"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _extras(kw: dict[str, Any]) -> dict[str, Any]:
    """ClusterOptions from the platform flags (--toleration, --affinity, --label, ...)."""
    from shardflow.cluster.manifests import extras

    return dict(
        tolerations=[extras.parse_toleration(t) for t in kw["tolerations"]],
        affinity=extras.load_affinity(kw["affinity"]) if kw["affinity"] else None,
        priority_class=kw["priority_class"], labels=dict(_pairs(kw["labels"], "--label")),
        extra_annotations=dict(_pairs(kw["annotations"], "--annotation")),
        secret_files=[extras.parse_secret_file(s) for s in kw["secret_files"]],
    )


def _render(kind: str, jobfile: str, inputs: str | list[str] | None, outputs: str | None, run_dir: str | None,
            overrides: tuple[str, ...], storage_option: tuple[str, ...], image: str, no_prepare: bool, force: bool,
            extend: bool, retry_failed: bool, **kw: Any) -> None:
    from shardflow.cluster import manifests
    from shardflow.job.jobfile import load_job, parse_overrides

    options = parse_storage_options(storage_option)
    rerun = rerun_flags(redo=force, extend=extend, retry_failed=retry_failed, no_prepare=no_prepare)
    try:
        job = load_job(jobfile, inputs=inputs, outputs=outputs, overrides=parse_overrides(overrides),
                       run_dir=run_dir, storage_options=options)
        cluster = dict(
            name=kw["name"] or f"shardflow-{job.name}", namespace=kw["namespace"], parallelism=kw["parallelism"],
            tasks_per_pod=kw["tasks_per_pod"], cpu=kw["cpu"], memory=kw["memory"], secrets=kw["secrets"],
            env=dict(_pairs(kw["env"], "--env")), service_account=kw["service_account"],
            image_pull_secrets=kw["pull_secrets"], node_selector=dict(_pairs(kw["node_selector"], "--node-selector")),
            pvcs=_pairs(kw["pvc"], "--pvc", ":"), retries=kw["retries"], ttl=kw["ttl"], deadline=kw["deadline"],
            tmp_size=kw["tmp_size"], gpus=kw["gpus"], **_extras(kw),
        )
        if kind == "kubernetes":
            cluster["max_failed_indexes"] = kw["max_failed_indexes"]
        else:
            cluster["retry_max_duration"] = kw["retry_max_duration"]
        opts = manifests.from_job(job, image, prepare=not no_prepare, rerun=rerun, **cluster)
        text = manifests.render_options(opts, kind)
    except (ShardflowError, ValueError) as exc:
        raise Fail(so.scrub(str(exc), options), EXIT_ERROR) from None
    except KeyError as exc:  # a ${VAR} storage option whose variable is not set here
        raise Fail(str(exc.args[0]) if exc.args else repr(exc), EXIT_ERROR) from None
    per = opts.per_pod(kind)
    where = "nothing written (--no-prepare)" if no_prepare else f"plan written to {opts.run_dir}"
    name = f"Job {opts.job_name}" if kind == "kubernetes" else f"Workflow {opts.name}-*"
    click.echo(f"shardflow: {name}: {opts.tasks} tasks, {opts.indexes(kind)} pods of {per} task(s); {where}", err=True)
    if kw["tasks_per_pod"] and per > kw["tasks_per_pod"]:
        click.echo(f"shardflow: --tasks-per-pod {kw['tasks_per_pod']} raised to {per}: an Argo Workflow fans out "
                   f"to at most {manifests.MAX_FANOUT.get(kind)} items (see docs/kubernetes.md)", err=True)
    click.echo(text, nl=False)


@click.command("k8s")
@_cluster_options
@click.option("--max-failed-indexes", type=click.IntRange(min=0), default=None,
              help="fail the Job once more indexes than this failed [default: 10%]")
def k8s_command(**kw: Any) -> None:
    """Plan JOBFILE and print a Kubernetes Indexed Job that runs it (pipe to `kubectl create -f -`)."""
    _render("kubernetes", **kw)


@click.command("argo")
@_cluster_options
@click.option("--retry-max-duration", metavar="DURATION", default=None,
              help="Argo backoff.maxDuration (e.g. 12h); counted from a chunk's FIRST attempt, so a chunk "
                   "preempted later is never retried [default: none]")
def argo_command(**kw: Any) -> None:
    """Plan JOBFILE and print an Argo Workflow that runs it (pipe to `argo submit -`)."""
    _render("argo", **kw)
