"""What each Ray task asks of the cluster: CPUs, GPUs, memory, retries, and anything else Ray takes.

- num_cpus: 1 per task (one task per core, as the processes backend runs one worker per core);
- num_gpus: `gpus_per_worker`, or 1 for a job with device="cuda" (Ray then sets CUDA_VISIBLE_DEVICES);
- memory: bytes the scheduler reserves per task (a request, not a limit), when given;
- max_retries: how often Ray reruns a task whose worker process or node died (default 3, Ray's), and
  one whose task failed with the transient kind (`io`): `retry_exceptions` names only that exception,
  so bad input and a user bug are never retried;
- `ray_args` / `--ray-arg KEY=VALUE`: any other option of Ray's `.options()` (resources, label_selector,
  scheduling_strategy, accelerator_type, ...), values read as YAML; they win over the above.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from shardflow.backends.ray.on_worker import TransientFailure
from shardflow.errors import JobError

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

DEFAULT_MAX_RETRIES = 3  # Ray's own default for tasks


def parse_ray_args(pairs: tuple[str, ...] | list[str] | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`("num_cpus=2", "resources={ssd: 1}")` -> {"num_cpus": 2, "resources": {"ssd": 1}}; None when empty."""
    if not pairs:
        return None
    if isinstance(pairs, Mapping):
        return dict(pairs)
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--ray-arg takes KEY=VALUE (an option of Ray's .options()), not {pair!r}")
        try:
            parsed[key.strip()] = _number(yaml.safe_load(value))
        except yaml.YAMLError as exc:
            raise JobError(f"--ray-arg {key.strip()}: cannot read {value!r} as a value: {exc}") from None
    return parsed


def _number(value: Any) -> Any:
    """YAML 1.1 reads `4e9` as a string; a size written so is meant as a number."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    return value


def task_options(job: "ShardJob", *, gpus_per_worker: int | None, memory: float | None, max_retries: int,
                 ray_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `.options()` of every Ray task of this run."""
    if max_retries < 0:
        raise JobError(f"max_retries must be >= 0, not {max_retries}")
    gpus = float(gpus_per_worker or 1) if (gpus_per_worker is not None or job.spec.device == "cuda") else 0.0
    options: dict[str, Any] = {"num_cpus": 1, "num_gpus": gpus, "max_retries": max_retries,
                               "retry_exceptions": [TransientFailure]}
    if memory is not None:
        options["memory"] = int(memory)
    extra = dict(ray_args or {})
    for fixed in ("retry_exceptions", "max_calls"):
        if fixed in extra:
            raise JobError(f"--ray-arg {fixed} is set by shardflow (only transient failures are retried, and worker "
                           "processes are kept for the run so setup runs once per process)")
    options.update(extra)
    return options


def slots(options: Mapping[str, Any], cluster: Mapping[str, float]) -> int:
    """How many of these tasks the cluster runs at once (by CPUs, and by GPUs for a GPU job)."""
    cpus = float(options.get("num_cpus") or 0)
    gpus = float(options.get("num_gpus") or 0)
    fits = [cluster.get("CPU", 0.0) / cpus] if cpus else []
    if gpus:
        fits.append(cluster.get("GPU", 0.0) / gpus)
    return max(1, int(min(fits))) if fits else max(1, int(cluster.get("CPU", 1.0)))


def check_resources(options: Mapping[str, Any], cluster: Mapping[str, float], *, autoscaling: bool) -> None:
    """Refuse a GPU run that no node can take (on a cluster that may scale up, say so and wait)."""
    need = float(options.get("num_gpus") or 0)
    if not need or cluster.get("GPU", 0.0) >= need:
        return
    message = (f"this job asks each task for num_gpus={need:g} and the Ray cluster has "
               f"{cluster.get('GPU', 0.0):g} GPUs")
    if autoscaling:
        print(f"shardflow: {message}; the tasks wait for GPU nodes to join", file=sys.stderr)
        return
    raise JobError(f"{message}: start it with GPU nodes (`ray start --num-gpus N`, a KubeRay worker group with "
                   "GPUs), or run without device='cuda' / --gpus-per-worker")
