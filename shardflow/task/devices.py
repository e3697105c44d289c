"""Devices of a job: which GPU each worker gets, its CPU threads, and the one-line error without CUDA.

`ShardJob(device=...)`: "cpu" (default behaviour), "cuda" (a GPU is required: without one each task
fails at once with one line and the run stops), "auto" (the GPU when there is one, else the CPU).
The processes backend gives each worker its own GPUs (`gpus_per_worker`, default 1 when the job asks
for a device) by setting CUDA_VISIBLE_DEVICES in the worker before CUDA starts, and starts one worker
per GPU slot by default; the job's code then simply uses "cuda" (`shardflow.worker_device()`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from shardflow.errors import JobError

DEVICES = ("cpu", "cuda", "auto")  # what a job may ask for (JobSpec.device)
_device = "cpu"  # what worker_device() answers in this process, set when a task starts


def worker_device() -> str:
    """The torch device the running job should use on this worker: "cuda" or "cpu".

    "cuda" means this worker's GPU (the processes backend pinned it with CUDA_VISIBLE_DEVICES, a pod or
    Dask worker has its own); call it in a callable class's constructor or a job file's setup().
    """
    return _device


def check_task_device(context: Any) -> None:
    """Before a task: refuse device="cuda" (or a -cuda decode) without CUDA, in one line; note the device."""
    global _device
    wanted = context.spec.device
    check = getattr(context.decoder, "check", None)
    if check is not None:
        check()  # GPU decode without a GPU (and without device="auto")
    if wanted not in ("cuda", "auto"):
        _device = "cpu"
        return
    from shardflow.codecs.gpu import cuda_available, no_cuda_message

    if cuda_available():
        _device = "cuda"
    elif wanted == "cuda":
        raise JobError(no_cuda_message("device='cuda'"))
    else:
        _device = "cpu"


def visible_gpus() -> list[str]:
    """The GPUs this machine lets us use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and not g.strip().startswith("-")]
    torch = sys.modules.get("torch")
    if torch is not None:
        return [str(i) for i in range(torch.cuda.device_count())]  # NVML: no CUDA context in the driver
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        lines = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(lines.splitlines()) if line.startswith("GPU ")]


@dataclass(frozen=True)
class GpuPlan:
    """How the processes backend lays workers over GPUs: one slot (CUDA_VISIBLE_DEVICES value) each."""

    slots: tuple[str, ...]

    @property
    def workers(self) -> int:
        return len(self.slots)

    def threads(self, workers: int) -> int:
        """CPU threads per GPU worker: the cores shared out (decode, copies and host ops use them)."""
        if any(name in os.environ for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")):
            return 0  # the user decides
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // max(1, workers))


def gpu_plan(device: str | None, gpus_per_worker: int | None) -> GpuPlan | None:
    """GPU slots for the workers, or None (a CPU job, or device="auto" on a machine without GPUs)."""
    if gpus_per_worker is None and device not in ("cuda", "auto"):
        return None
    per = gpus_per_worker or 1
    if per < 1:
        raise JobError(f"gpus_per_worker must be >= 1, not {per}")
    gpus = visible_gpus()
    if len(gpus) < per:
        if device == "auto" and gpus_per_worker is None:
            return None
        raise JobError(f"{'--gpus-per-worker ' + str(per) if gpus_per_worker else 'device=' + repr(device)}: "
                       f"{len(gpus)} GPU(s) visible here (CUDA_VISIBLE_DEVICES / nvidia-smi), need at least {per}")
    return GpuPlan(tuple(",".join(gpus[i * per : (i + 1) * per]) for i in range(len(gpus) // per)))


def pin_worker(slots: Any) -> None:
    """In a new worker process, before CUDA starts: take a GPU slot from the shared queue."""
    import queue

    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = slots.get(timeout=5)
    except queue.Empty:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # more workers than slots (a replaced worker): none
