"""A Kubernetes Indexed Job (batch/v1) that runs a planned shardflow job, one chunk per index.

Each pod runs `shardflow worker --run-dir URL --tasks-per-index K` and reads its index from
JOB_COMPLETION_INDEX. Exit codes drive the podFailurePolicy: 65 (bad input) fails only that index,
78 (fatal) fails the Job, disruptions (eviction, preemption) are ignored, anything else (75:
transient) is retried up to backoffLimitPerIndex times.
"""

from __future__ import annotations

from typing import Any

from shardflow.cluster.manifests.common import (
    CONTAINER,
    EXIT_BAD_INPUT,
    EXIT_STOP,
    ClusterOptions,
    container,
    pod_extras,
    pod_metadata,
    pod_security,
    volumes,
    worker_args,
)

KIND = "kubernetes"


def _on_exit(code: int) -> dict[str, Any]:
    return {"containerName": CONTAINER, "operator": "In", "values": [code]}


def pod_failure_policy() -> dict[str, Any]:
    """Rules in order: evictions first (whatever the exit code), then the worker's exit codes."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": _on_exit(EXIT_STOP)},
        {"action": "FailIndex", "onExitCodes": _on_exit(EXIT_BAD_INPUT)},
    ]}


def job_manifest(opts: ClusterOptions) -> dict[str, Any]:
    """The Job as a dict (dump it with common.dump)."""
    completions = opts.indexes(KIND)
    max_failed = opts.max_failed_indexes
    if max_failed is None:
        max_failed = max(1, completions // 10)
    max_failed = min(max_failed, completions, 10_000)
    labels = opts.all_labels()
    metadata: dict[str, Any] = {"name": opts.job_name}
    if opts.namespace:
        metadata["namespace"] = opts.namespace
    metadata["labels"] = labels
    metadata["annotations"] = opts.annotations(KIND)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": completions,
        "parallelism": min(opts.parallelism, completions),
        "backoffLimitPerIndex": opts.retries,
        "maxFailedIndexes": max_failed,
        "podReplacementPolicy": "Failed",  # a retry starts only once the old pod is gone: one writer per index
        "podFailurePolicy": pod_failure_policy(),
        "ttlSecondsAfterFinished": opts.ttl,
    }
    if opts.deadline:
        spec["activeDeadlineSeconds"] = opts.deadline
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        **pod_extras(opts),
        "securityContext": pod_security(),
        "containers": [container(opts, worker_args(opts, KIND))],
        "volumes": volumes(opts),
    }
    spec["template"] = {"metadata": pod_metadata(opts), "spec": pod}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}
