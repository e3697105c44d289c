"""Kubernetes Indexed Jobs and Argo Workflows for planned shardflow jobs (see docs/kubernetes.md).

    text = render(job, "kubernetes", image="registry/shardflow:0.1", parallelism=64)
    text = render(job, "argo", image=..., prepare=False)   # nothing written; tasks counted from inputs
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardflow.cluster.manifests.common import MAX_FANOUT, ClusterOptions, dump, from_job
from shardflow.errors import JobError
from shardflow.job.rerun import Rerun

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

# kind -> (module, function building the manifest dict from ClusterOptions), imported on first use
KIND_BUILDERS = {
    "kubernetes": ("shardflow.cluster.manifests.kubernetes", "job_manifest"),  # a batch/v1 Indexed Job
    "argo": ("shardflow.cluster.manifests.argo", "workflow_manifest"),  # an argoproj.io/v1alpha1 Workflow
}
KINDS = tuple(KIND_BUILDERS)

__all__ = ["KINDS", "MAX_FANOUT", "ClusterOptions", "manifest", "render", "render_options"]


def manifest(opts: ClusterOptions, kind: str) -> dict[str, Any]:
    """The manifest dict of `kind` ("kubernetes": a batch/v1 Job; "argo": a Workflow)."""
    try:
        module, function = KIND_BUILDERS[kind]
    except KeyError:
        raise JobError(f"unknown manifest kind {kind!r}; choose one of {', '.join(KINDS)}") from None
    return getattr(importlib.import_module(module), function)(opts)


def render_options(opts: ClusterOptions, kind: str) -> str:
    """YAML text of the manifest, with a comment header saying what it runs."""
    per = opts.per_pod(kind)
    what = "Indexed Job" if kind == "kubernetes" else "Argo Workflow"
    raised = (f" (--tasks-per-pod {opts.tasks_per_pod} raised to {per}: at most {MAX_FANOUT[kind]:,} items "
              f"per {what})" if opts.tasks_per_pod and per > opts.tasks_per_pod else "")
    header = (
        f"shardflow {what}: {opts.tasks} tasks in {opts.indexes(kind)} chunks of {per}{raised}.\n"
        f"Pods read plan.json and job.pkl from {opts.run_dir}:\n"
        "write them first (shardflow k8s/argo without --no-prepare, or job.prepare()).\n"
        + ("Worker exit codes: 0 done, 65 bad input (FailIndex), 75 transient (retried), 78 fatal (FailJob)."
           if kind == "kubernetes" else
           "Worker exit codes: 0 done, 65 bad input and 78 fatal (not retried), others retried with backoff.\n"
           "Submit with `argo submit` or `kubectl create` (generateName).")
    )
    return dump(manifest(opts, kind), header)


def render(job: "ShardJob", kind: str, image: str, *, prepare: bool = True, force: bool = False,
           **options: Any) -> str:
    """YAML of a `kind` manifest for `job` (writing its plan to the run directory first with `prepare`)."""
    if kind not in KINDS:
        raise JobError(f"unknown manifest kind {kind!r}; choose one of {', '.join(KINDS)}")
    return render_options(from_job(job, image, prepare=prepare, rerun=Rerun.of(force=force), **options), kind)
