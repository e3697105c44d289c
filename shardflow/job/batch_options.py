"""The batching, per-worker and device settings of a ShardJob: checked, described, handed to run_task.

Kept out of job/shard_job.py so that file only passes them along. `batch_size`, `collate` and `device` shape
the output bytes of jobs that draw from the global generators (they are seeded per batch), so they
enter the plan's fingerprint, but only when set: plans of per-sample jobs keep their old fingerprint.
"""

from __future__ import annotations

from typing import Any

from shardflow.errors import JobError
from shardflow.task.worker_fn import SetupCall

DEVICES = ("cpu", "cuda", "auto")
BATCHING_SETTINGS = frozenset({"batch_size", "collate", "device"})


def check_batching(batch_size: Any, collate: Any, device: Any) -> tuple[int | None, bool, str | None]:
    """Refuse bad values when the job is made, with the setting's name in the message."""
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise JobError(f"batch_size must be an integer >= 1 (or None: one sample at a time), not {batch_size!r}")
    if not isinstance(collate, bool):
        raise JobError(f"collate must be true or false, not {collate!r}")
    if collate and batch_size is None:
        raise JobError("collate=True needs batch_size (it shapes batches into columns)")
    if device is not None and device not in DEVICES:
        raise JobError(f"device must be one of {', '.join(DEVICES)} (or None), not {device!r}")
    return batch_size, collate, device


def describe_batching(job: Any) -> dict[str, Any]:
    """The settings for plan.json: only those set, so per-sample plans describe (and hash) as before."""
    out: dict[str, Any] = {}
    if job.batch_size is not None:
        out["batch_size"] = job.batch_size
        out["collate"] = job.collate
    if job.device is not None:
        out["device"] = job.device
    made = getattr(job, "_per_worker", None)
    if made is not None:  # the class, or the job file's process (made through its setup())
        target = made.args[1] if made.factory is SetupCall else made.factory
        out["fn"] = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', made.label)}"
    return out


def batching_context(job: Any) -> dict[str, Any]:
    """The TaskContext fields of these settings (run_task resolves a PerWorker fn on the worker)."""
    made = getattr(job, "_per_worker", None)
    return {
        "fn": job.fn if made is None else made, "identity": getattr(job, "_identity", ""),
        "batch_size": job.batch_size, "collate": job.collate, "device": job.device,
        "fn_guard": getattr(job, "fn_guard", None),
    }
