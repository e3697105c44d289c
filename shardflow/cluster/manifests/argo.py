"""An Argo Workflow that runs a planned shardflow job: a fan-out over chunk ids, then a summary step.

The fan-out is `withSequence: {count: N}`, so the Workflow stays a few KB whatever the number of
shards (etcd's 1.5 MB object limit is never near). Each item runs `shardflow worker --index {{item}}`
with a retryStrategy that backs off and never retries exit 65 (bad input) or 78 (fatal); the last
step, `shardflow worker --finalize`, rebuilds summary.json from the completion markers and fails the
Workflow when a task is missing.
"""

from __future__ import annotations

from typing import Any

from shardflow.cluster.manifests.common import (
    EXIT_BAD_INPUT,
    EXIT_RETRY,
    EXIT_STOP,
    ClusterOptions,
    container,
    finalize_memory,
    pod_extras,
    pod_metadata,
    pod_security,
    storage_args,
    volumes,
    worker_args,
)
from shardflow.errors import JobError
from shardflow.text import redact_userinfo, safe_repr

KIND = "argo"

# `lastRetry.status == 'Error'`: the pod itself failed (evicted, deleted, node lost): always worth a retry
RETRY_EXPRESSION = (f"lastRetry.status == 'Error' || "
                    f"!(asInt(lastRetry.exitCode) in [{EXIT_BAD_INPUT}, {EXIT_STOP}])")
FINALIZE_RETRY_EXPRESSION = f"lastRetry.status == 'Error' || asInt(lastRetry.exitCode) == {EXIT_RETRY}"
# the Workflow's own Argo variables: the only strings of it that may hold `{{` (check_no_braces)
ITEM, INDEX = "{{item}}", "{{inputs.parameters.index}}"


def retry_strategy(limit: int, expression: str, max_duration: str | None = None) -> dict[str, Any]:
    """Up to `limit` retries, 30 s apart doubling each time. Argo counts backoff.maxDuration from the
    node's FIRST attempt, so a chunk preempted after longer than that would never be retried: no
    maxDuration unless one is asked for (`--retry-max-duration`)."""
    backoff = {"duration": "30s", "factor": "2"}
    if max_duration:
        backoff["maxDuration"] = max_duration
    return {"limit": str(limit), "retryPolicy": "Always", "expression": expression, "backoff": backoff}


def finalize_container(opts: ClusterOptions) -> dict[str, Any]:
    """The summary step, its memory sized from the task count: it holds the merged report (every
    output shard's receipt) while it writes summary.json (bench/README.md "Scale": 1.75 GB at 1M)."""
    spec = container(opts, ["worker", "--run-dir", opts.run_dir, "--finalize", *storage_args(opts)])
    memory = finalize_memory(opts.memory, opts.tasks)
    spec["resources"] = {**spec["resources"], "requests": {**spec["resources"]["requests"], "memory": memory},
                         "limits": {**spec["resources"]["limits"], "memory": memory}}
    return spec


def workflow_manifest(opts: ClusterOptions) -> dict[str, Any]:
    """The Workflow as a dict (dump it with common.dump)."""
    count = opts.indexes(KIND)
    labels = opts.all_labels()
    metadata: dict[str, Any] = {"generateName": f"{opts.name}-"}
    if opts.namespace:
        metadata["namespace"] = opts.namespace
    metadata["labels"] = labels
    metadata["annotations"] = opts.annotations(KIND)
    spec: dict[str, Any] = {"entrypoint": "main", **pod_extras(opts)}
    if "priorityClassName" in spec:  # a Workflow names the pods' priority class so
        spec["podPriorityClassName"] = spec.pop("priorityClassName")
    if opts.deadline:
        spec["activeDeadlineSeconds"] = opts.deadline
    spec.update({
        "podGC": {"strategy": "OnPodSuccess"},  # failed pods stay for their logs until the TTL
        "ttlStrategy": {"secondsAfterCompletion": opts.ttl},
        "podMetadata": pod_metadata(opts),
        "securityContext": pod_security(),
        "volumes": volumes(opts),
    })
    worker = worker_args(opts, KIND)
    spec["templates"] = [
        {
            "name": "main",
            "parallelism": min(opts.parallelism, count),
            "steps": [
                [{
                    "name": "chunks",
                    "template": "chunk",
                    "arguments": {"parameters": [{"name": "index", "value": ITEM}]},
                    "withSequence": {"count": str(count)},
                    # a failed item (exit code) or an errored one (pod evicted, deleted, node lost) must not
                    # stop the step group: the summary step still runs and tells what failed
                    "continueOn": {"failed": True, "error": True},
                }],
                [{"name": "summary", "template": "finalize"}],
            ],
        },
        {
            "name": "chunk",
            "inputs": {"parameters": [{"name": "index"}]},
            "retryStrategy": retry_strategy(opts.retries, RETRY_EXPRESSION, opts.retry_max_duration),
            "container": container(opts, [*worker, "--index", INDEX]),
        },
        {
            "name": "finalize",
            "retryStrategy": retry_strategy(opts.retries, FINALIZE_RETRY_EXPRESSION, opts.retry_max_duration),
            "container": finalize_container(opts),
        },
    ]
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": metadata, "spec": spec}
    check_no_braces(workflow)
    return workflow


def check_no_braces(node: Any) -> None:
    """Refuse a Workflow in which a string of the user's (a run directory, a storage option, an env
    value, an annotation) holds `{{`.

    Argo reads `{{...}}` in a Workflow as a variable: a name it knows is replaced (`{{workflow.name}}`),
    any other fails the Workflow ("failed to resolve"), a `{{` with no `}}` too, and it has no escape for
    it (argo-workflows#8253, #2430). `$` needs none here: container() writes Kubernetes' escape."""
    if isinstance(node, dict):
        for value in node.values():
            check_no_braces(value)
    elif isinstance(node, list):
        for value in node:
            check_no_braces(value)
    elif isinstance(node, str) and "{{" in node and node not in (ITEM, INDEX):
        raise JobError(f"{safe_repr(redact_userinfo(node))} holds '{{{{', which Argo Workflows reads as a template "
                       "variable and cannot escape: choose a path (or value) without it, or run a Kubernetes Job "
                       "(shardflow k8s)")
