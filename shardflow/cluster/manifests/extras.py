"""What a platform team adds to shardflow's pods, checked before it reaches the API server.

Scheduling (tolerations, affinity, priority class), labels and annotations, Secrets mounted as
files, thread limits from the CPU request, unique names for reruns, the run's fingerprint as a label,
and the refusal of a run directory the pods could never see. Kept apart from common.py so that the
pod itself stays readable there; the CLI parses flags with the `parse_*` functions here.
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import yaml

from shardflow.errors import JobError
from shardflow.storage.paths import is_local, local_path
from shardflow.task.threads import THREAD_VARIABLES, cpu_threads

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

ClusterOptions = Any  # common.ClusterOptions, which imports this module

FINGERPRINT_LABEL = "shardflow/fingerprint"
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits


# -- names and labels ------------------------------------------------------------------------------
def unique_suffix(length: int = 5) -> str:
    """A random suffix like Kubernetes' generateName: a rerun within the TTL gets a new Job name."""
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(length))


def run_fingerprint(job: "ShardJob") -> str:
    """The label value naming what a run computes: 16 hex digits over the job's code fingerprint
    (job.fingerprint), the settings that shape the outputs and the input/output specs as written.
    Computed from the specs, not the tasks: a million-task job is labelled without planning it."""
    import hashlib
    import json

    from shardflow.job.fingerprint import code_fingerprint
    from shardflow.storage.options import redact_urls_deep

    what = {"code": code_fingerprint(job)["fingerprint"], "settings": job.settings(),
            "inputs": redact_urls_deep(job.inputs), "outputs": redact_urls_deep(job.outputs)}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def check_label_key(key: str, what: str = "label") -> None:
    if len(key) > 253 + 1 + 63 or not _QUALIFIED.fullmatch(key) or len(key.rpartition("/")[2]) > 63:
        raise JobError(f"{what} key {key!r} is not a Kubernetes qualified name (prefix/name, name <= 63 "
                       "characters of letters, digits, '-', '_', '.')")


def check_labels(labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        check_label_key(key)
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            raise JobError(f"label {key}={value!r}: values are <= 63 letters, digits, '-', '_', '.'")


# -- scheduling --------------------------------------------------------------------------------------
def parse_toleration(text: str) -> dict[str, Any]:
    """`KEY[=VALUE][:EFFECT]` (kubectl taint syntax) as a toleration; no value: operator Exists."""
    spec, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, has_value, value = spec.partition("=")
    if not key:
        raise JobError(f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu=present:NoSchedule")
    check_label_key(key, "toleration")
    if effect and effect not in TOLERATION_EFFECTS:
        raise JobError(f"--toleration {text!r}: effect must be one of {', '.join(TOLERATION_EFFECTS)}")
    out: dict[str, Any] = {"key": key, "operator": "Equal" if has_value else "Exists"}
    if has_value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def load_affinity(path: str | Path) -> dict[str, Any]:
    """A pod `affinity` from a YAML or JSON file (the affinity object itself, or {affinity: ...})."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise JobError(f"--affinity {path}: {exc}") from None
    if isinstance(data, dict) and set(data) == {"affinity"}:
        data = data["affinity"]
    known = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    if not isinstance(data, dict) or not data or set(data) - known:
        raise JobError(f"--affinity {path}: expected a mapping with {', '.join(sorted(known))}")
    return json.loads(json.dumps(data))


def parse_secret_file(text: str) -> tuple[str, str]:
    """`NAME:PATH`: the Secret NAME mounted read-only as files under the absolute PATH."""
    name, _, path = text.partition(":")
    if not name or not path.startswith("/"):
        raise JobError(f"--secret-file {text!r}: expected NAME:/absolute/path")
    return name, posixpath.normpath(path)


def scheduling(opts: ClusterOptions) -> dict[str, Any]:
    """Pod-spec fields for where pods run: priority class, tolerations, affinity (when given)."""
    out: dict[str, Any] = {}
    if opts.priority_class:
        out["priorityClassName"] = opts.priority_class
    if opts.tolerations:
        out["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.affinity:
        out["affinity"] = dict(opts.affinity)
    return out


# -- container ---------------------------------------------------------------------------------------
def thread_env(opts: ClusterOptions) -> list[dict[str, str]]:
    """OMP/MKL/OpenBLAS threads from the CPU request (the worker sets torch's from them), unless --env sets them."""
    threads = str(cpu_threads(opts.cpu))
    return [{"name": name, "value": threads} for name in THREAD_VARIABLES if name not in opts.env]


def secret_file_volumes(opts: ClusterOptions) -> list[dict[str, Any]]:
    return [{"name": f"secret-file-{i}", "secret": {"secretName": name}}
            for i, (name, _) in enumerate(opts.secret_files)]


def secret_file_mounts(opts: ClusterOptions) -> list[dict[str, Any]]:
    return [{"name": f"secret-file-{i}", "mountPath": path, "readOnly": True}
            for i, (_, path) in enumerate(opts.secret_files)]


# -- the run directory --------------------------------------------------------------------------------
def check_run_dir(run_dir: str, pvcs: Sequence[tuple[str, str]]) -> None:
    """Refuse a run directory on this machine's disk that no --pvc mount puts in the pods too.

    Otherwise the plan is written here, every pod finds no plan.json and exits 78.
    """
    if not is_local(run_dir):
        return
    path = local_path(run_dir)
    mounts = [posixpath.normpath(mount) for _, mount in pvcs]
    if not posixpath.isabs(path):
        raise JobError(f"run directory {run_dir} is a relative path, which means nothing in a pod: give --run-dir "
                       "an object-store URL (s3://, gs://) or an absolute path under a --pvc CLAIM:PATH mount")
    norm = posixpath.normpath(path)
    if not any(norm == m or norm.startswith(m.rstrip("/") + "/") for m in mounts):
        where = f" (mounted: {', '.join(mounts)})" if mounts else ""
        raise JobError(f"run directory {run_dir} is on this machine's disk, which the pods do not see{where}: give "
                       "--run-dir an object-store URL (s3://, gs://) or a path under a --pvc CLAIM:PATH mount that "
                       "this machine shares at the same path")
