"""GPU jobs on Dask: each task asks for worker resources `{"GPU": n}`, so a worker started with
`dask worker --resources GPU=1` runs one such task at a time, on its GPU.

Only for a cluster shardflow connects to (an address or a client): a LocalCluster it starts itself
declares no resources (use the processes backend on one GPU machine: it pins one worker per GPU).
A cluster where no worker offers the resource would leave the tasks waiting forever, so that is
refused up front with the command that fixes it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from shardflow.errors import JobError

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob


def task_resources(job: "ShardJob", gpus_per_worker: int | None) -> dict[str, float] | None:
    """`{"GPU": n}` for a job that needs GPUs (device="cuda" or gpus_per_worker given), else None."""
    if gpus_per_worker is None and job.spec.device != "cuda":
        return None
    return {"GPU": float(gpus_per_worker or 1)}


def check_resources(client: Any, resources: dict[str, float] | None) -> None:
    """Refuse a run whose tasks no worker of the cluster could ever take."""
    if not resources:
        return
    try:
        workers = client.scheduler_info().get("workers", {})
    except Exception:  # noqa: BLE001 - cannot tell: let the run try
        return
    need = resources["GPU"]
    able = [w for w, info in workers.items() if float((info.get("resources") or {}).get("GPU", 0)) >= need]
    if workers and not able:
        raise JobError(f"this job asks each task for GPU={need:g} and no Dask worker offers it: start workers "
                       f"with `dask worker SCHEDULER --resources GPU={need:g}` (one per GPU, each with its "
                       "CUDA_VISIBLE_DEVICES), or run without device='cuda' / --gpus-per-worker")
    if not workers:
        print("shardflow: no Dask workers yet; GPU tasks wait for a worker started with --resources GPU=...",
              file=sys.stderr)
