"""What a Kubernetes Job and an Argo Workflow of shardflow share: the pod, its container, chunking.

The manifests carry no shard URLs and no credentials: the plan and the pickled job live in the run
directory, and each pod only learns its chunk index (JOB_COMPLETION_INDEX, or an Argo item).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import yaml

from shardflow.cluster.contract import (
    DEFAULT_INDEX_RETRIES,
    EXIT_BAD_INPUT,
    EXIT_RETRY,
    EXIT_STOP,
    chunk_count,
    index_retries,
)
from shardflow.cluster.manifests import extras
from shardflow.cluster.prepare import prepare_run_dir
from shardflow.errors import JobError
from shardflow.job.rerun import Rerun
from shardflow.storage import options as so

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

CONTAINER = "worker"
UID = 10001  # the image's non-root user (docker/Dockerfile)
# Kubernetes allows more completions only with parallelism and maxFailedIndexes <= 10,000 (docs/kubernetes.md)
MAX_INDEXES = 100_000
AUTO_INDEXES = {"kubernetes": 10_000, "argo": 2_000}  # auto --tasks-per-pod keeps chunks under these
# Hard caps whatever --tasks-per-pod says: an Argo Workflow's status grows per node (over 1 MiB from
# ~9,500 items) and node ids (FNV hashes of names) collide at ~100k; the chunk size is raised instead.
MAX_FANOUT = {"argo": 2_000}
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_EXPANDED = re.compile(r"\$(?=[$(])")  # a `$` the kubelet would read as part of `$$` or `$(` (literal)

__all__ = ["ClusterOptions", "EXIT_BAD_INPUT", "EXIT_RETRY", "EXIT_STOP", "dump", "from_job"]


@dataclass
class ClusterOptions:
    """Everything a manifest says; `from_job` fills the job's part (task count, run dir, name)."""

    image: str
    run_dir: str
    tasks: int
    name: str = "shardflow"
    namespace: str | None = None
    parallelism: int = 16
    tasks_per_pod: int | None = None  # None: auto (1, or more when the tasks would need too many pods)
    cpu: str = "1"
    memory: str = "2Gi"
    secrets: Sequence[str] = ()  # Secret names whose keys become env vars (envFrom/secretRef)
    env: Mapping[str, str] = field(default_factory=dict)  # plain, non-secret env vars
    storage_options: Sequence[str] = ()  # `-o KEY=VALUE` items for the worker (never secrets)
    service_account: str | None = None
    image_pull_secrets: Sequence[str] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    pvcs: Sequence[tuple[str, str]] = ()  # (claim name, mount path)
    retries: int = DEFAULT_INDEX_RETRIES  # backoffLimitPerIndex / Argo retryStrategy.limit (from_job: the job's)
    max_failed_indexes: int | None = None  # None: 10% of the indexes (at least 1)
    ttl: int = 86_400  # seconds a finished Job/Workflow is kept
    deadline: int | None = None  # activeDeadlineSeconds of the whole run
    tmp_size: str = "1Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    # added by platform teams (see extras.py; the CLI's --toleration, --affinity, ... parse into these)
    extra_annotations: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class: str | None = None
    secret_files: Sequence[tuple[str, str]] = ()  # (Secret name, mount path): keys become files there
    fingerprint: str | None = None  # label naming what the run computes (extras.run_fingerprint)
    unique: str = ""  # suffix of the Kubernetes Job name, new on every render, so reruns never collide
    retry_max_duration: str | None = None  # Argo backoff.maxDuration (counted from the FIRST attempt)
    gpus: int = 0  # nvidia.com/gpu limit per pod (docs/gpu.md)

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise JobError("the plan has no tasks")
        for name in ("parallelism", "retries", "ttl"):
            if getattr(self, name) < (0 if name in ("retries", "ttl") else 1):
                raise JobError(f"{name} must be >= {0 if name in ('retries', 'ttl') else 1}")
        if self.tasks_per_pod is not None and self.tasks_per_pod < 1:
            raise JobError("tasks per pod must be >= 1")
        for key in self.env:
            if so.is_secret_name(key):
                raise JobError(f"env {key} looks like a secret: put it in a Kubernetes Secret and pass --secret NAME")
        self.name = k8s_name(self.name)
        extras.check_labels(self.labels)
        for key in self.extra_annotations:
            extras.check_label_key(key, "annotation")

    @property
    def job_name(self) -> str:
        """The Kubernetes Job's name: `name-unique` (a rerun renders a new one), or `name`."""
        return f"{self.name}-{self.unique}" if self.unique else self.name

    def per_pod(self, kind: str) -> int:
        """Tasks per index: as given, else the fewest that keep the index count under AUTO_INDEXES."""
        per = self.tasks_per_pod or max(1, math.ceil(self.tasks / AUTO_INDEXES[kind]))
        cap = MAX_FANOUT.get(kind)
        if cap is not None and chunk_count(self.tasks, per) > cap:
            per = math.ceil(self.tasks / cap)  # raised: render_options' header says so
        if chunk_count(self.tasks, per) > MAX_INDEXES:
            raise JobError(f"{self.tasks} tasks at {per} per pod need more than {MAX_INDEXES} indexes; "
                           f"use --tasks-per-pod {math.ceil(self.tasks / MAX_INDEXES)} or more")
        return per

    def indexes(self, kind: str) -> int:
        return chunk_count(self.tasks, self.per_pod(kind))

    def all_labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "shardflow",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/component": "worker",
            "app.kubernetes.io/managed-by": "shardflow",
            **({extras.FINGERPRINT_LABEL: self.fingerprint} if self.fingerprint else {}),
            **self.labels,
        }

    def annotations(self, kind: str) -> dict[str, str]:
        return {
            "shardflow/run-dir": self.run_dir,
            "shardflow/tasks": str(self.tasks),
            "shardflow/tasks-per-index": str(self.per_pod(kind)),
            **self.extra_annotations,
        }


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "K": 10**3, "M": 10**6,
          "G": 10**9, "T": 10**12}
# What `worker --finalize` needs: its memory no longer holds the shard list (summary.json is written as a
# stream), so it grows by ~270 bytes a task (the done set), measured in its worst case, markers only
# (bench/bench_markers_only.py: 71 MB at 100k tasks, 314 MB at 1M); 1 KiB a task leaves room for an object
# store's client and listings. (The shard list it held before cost 1.75 GB at 1M, which 2 KiB a task covered.)
FINALIZE_BASE, FINALIZE_PER_TASK = 512 * 2**20, 2**10


def finalize_memory(memory: str, tasks: int) -> str:
    """`memory`, or more when `tasks` need it in the step that merges every task's receipts."""
    need = FINALIZE_BASE + FINALIZE_PER_TASK * tasks
    match = _QUANTITY.match(memory.strip())
    if match is None or float(match.group(1)) * _UNITS[match.group(2)] >= need:
        return memory
    return f"{math.ceil(need / 2**30)}Gi"


def k8s_name(text: str, limit: int = 50) -> str:
    """A DNS-1123 label (lower-case letters, digits, '-'), short enough for pod names to add a suffix."""
    name = _DNS_LABEL.sub("-", text.lower()).strip("-")[:limit].strip("-")
    if not name:
        raise JobError(f"cannot make a Kubernetes name from {text!r}")
    return name


def worker_args(opts: ClusterOptions, kind: str) -> list[str]:
    """`shardflow worker` arguments shared by every index (the index itself comes separately)."""
    return ["worker", "--run-dir", opts.run_dir, "--tasks-per-index", str(opts.per_pod(kind)), *storage_args(opts)]


def storage_args(opts: ClusterOptions) -> list[str]:
    return [arg for item in opts.storage_options for arg in ("--storage-option", item)]


def literal(text: str) -> str:
    """`text` written so that Kubernetes hands it to the container as it is.

    The kubelet expands `$(VAR)` in a container's command, args and env values when VAR is in the
    container's environment (every pod here has HOME; --env, --secret keys), reads `$$` as one `$`
    wherever it stands ("$$(VAR)" is the documented escape), and leaves any other `$` as it is (k8s
    third_party/forked/golang/expansion). So a `$` before `$` or `(` is doubled and the rest kept (a
    `${VAR}` storage option stays readable): an output folder `o$(HOME)` stays that folder, never
    `o/tmp`, and `a$$b` stays `a$$b`. The one place both manifests' containers get their strings."""
    return _EXPANDED.sub("$$", text)


def container(opts: ClusterOptions, args: list[str]) -> dict[str, Any]:
    """The worker container of both manifests: `shardflow ARGS`, its env, resources and mounts; every
    arg and env value passed literally (`literal`: no `$(VAR)` expansion by Kubernetes)."""
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += extras.thread_env(opts)
    env += [{"name": k, "value": str(v)} for k, v in sorted(opts.env.items())]
    spec: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["shardflow"],
        "args": [literal(arg) for arg in args],
        "env": [{**item, "value": literal(item["value"])} for item in env],
    }
    if opts.secrets:
        spec["envFrom"] = [{"secretRef": {"name": s}} for s in opts.secrets]
    spec["resources"] = {"requests": {"cpu": opts.cpu, "memory": opts.memory}, "limits": {"memory": opts.memory}}
    if opts.gpus:  # an extended resource: the limit alone is the request too
        spec["resources"]["limits"]["nvidia.com/gpu"] = str(opts.gpus)  # a quantity (hera: a string)
    spec["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    mounts += [{"name": f"data-{i}", "mountPath": path} for i, (_, path) in enumerate(opts.pvcs)]
    spec["volumeMounts"] = mounts + extras.secret_file_mounts(opts)
    return spec


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(opts: ClusterOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": opts.tmp_size}}]
    for i, (claim, _) in enumerate(opts.pvcs):
        out.append({"name": f"data-{i}", "persistentVolumeClaim": {"claimName": claim}})
    return out + extras.secret_file_volumes(opts)


def pod_metadata(opts: ClusterOptions) -> dict[str, Any]:
    """Labels (and the user's annotations) of every pod."""
    out: dict[str, Any] = {"labels": opts.all_labels()}
    if opts.extra_annotations:
        out["annotations"] = dict(opts.extra_annotations)
    return out


def pod_extras(opts: ClusterOptions) -> dict[str, Any]:
    """Optional pod-spec fields (service account, pull secrets, node selector, scheduling) when given."""
    out: dict[str, Any] = {}
    if opts.service_account:
        out["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    if opts.node_selector:
        out["nodeSelector"] = dict(sorted(opts.node_selector.items()))
    return {**out, **extras.scheduling(opts)}


# -- from a job -----------------------------------------------------------------------------------
def worker_storage_options(job: "ShardJob", url: str, *, warn: bool = True) -> list[str]:
    """`-o` items that let a pod open the run directory, secrets left out (they come from --secret)."""
    raw = so.options_for(url, job.storage_options, resolve_env=False)
    items, dropped = [], []
    for key, value in _flatten(raw):
        leaf = key.rsplit(".", 1)[-1]
        if so.redact({leaf: value}) != {leaf: value}:  # a secret value, or a URL with credentials
            dropped.append(key)
            continue
        items.append(f"{key}={_option_text(value)}")
    if dropped and warn:
        print(f"shardflow: storage option(s) {', '.join(dropped)} left out of the manifest (secret values); "
              "give pods their credentials with --secret NAME (a Kubernetes Secret whose keys are env vars "
              "such as AWS_SECRET_ACCESS_KEY), or write them as ${VAR} references", file=sys.stderr)
    return items


def _flatten(options: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in options.items():
        if isinstance(value, Mapping) and value:
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _option_text(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
        return json.dumps(value)  # "3" or "true" as text: quoted so the worker keeps it a string
    return json.dumps(value)


def from_job(job: "ShardJob", image: str, *, prepare: bool = True, rerun: Rerun = Rerun(),
             **options: Any) -> ClusterOptions:
    """ClusterOptions for `job`; with `prepare`, the plan and job.pkl are written to its run dir first.

    Without `prepare` nothing is written: the task count comes from the inputs spec (brace patterns
    need no storage access; globs are listed once). A run directory the pods cannot see is refused.
    """
    extras.check_run_dir(job.run_dir, options.get("pvcs", ()))
    if prepare:
        prepare_run_dir(job, rerun)  # storage trouble: one line naming the way out (--no-prepare)
    tasks = job.task_count()  # without prepare, 1M tasks are counted, not built
    if options.get("retries") is None:
        options["retries"] = index_retries(job.spec.io_retries)
    options.setdefault("name", f"shardflow-{job.name}")
    options.setdefault("fingerprint", extras.run_fingerprint(job))
    options.setdefault("unique", extras.unique_suffix())
    if "storage_options" not in options:
        options["storage_options"] = worker_storage_options(job, job.run_dir)
    return ClusterOptions(image=image, run_dir=job.run_dir, tasks=tasks, **options)


# -- YAML -------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: manifests are read by people
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(manifest: Mapping[str, Any], header: str = "") -> str:
    """YAML text of a manifest (key order kept), with `header` as leading comment lines."""
    body = yaml.dump(dict(manifest), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096)
    lines = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return lines + body
