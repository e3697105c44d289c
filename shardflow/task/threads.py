"""Intra-op threads of torch and the BLAS/OpenMP libraries where tasks run on shared cores.

A library that sees a 64-core node starts 64 threads even in a `cpu: 1` pod or in one of 16 Dask
worker processes: many times slower than one thread per core (measured 3x). Pods get the variables
from their manifest (`--cpu`), Dask workers from their thread count; a value the user set wins.
"""

from __future__ import annotations

import math
import os
import sys

from shardflow.codecs import planes

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_threads(cpu: str | int | float) -> int:
    """Threads for a Kubernetes CPU quantity ("1", "500m", "2.5"): its whole cores, at least 1."""
    text = str(cpu).strip()
    try:
        cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return 1
    return max(1, math.floor(cores)) if math.isfinite(cores) else 1


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def limit_threads(threads: int | None = None) -> int:
    """Apply a thread count to this process: the OMP/MKL/OpenBLAS variables (for libraries loaded
    later), torch when it is already imported, and OpenCV. A count the environment already sets wins
    over `threads`; returns the count in force."""
    given = os.environ.get("OMP_NUM_THREADS")
    if given and given.isdigit() and int(given) > 0:
        threads = int(given)
    threads = max(1, int(threads or 1))
    apply_threads(threads)
    return threads


def apply_threads(threads: int) -> None:
    """Give this process `threads` as decided (no precedence here: the pool's workers get their
    driver's count, which a fork server's older environment must not override): the OMP/MKL/OpenBLAS
    variables where unset, OpenCV, and torch when it is already imported."""
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    planes.limit_threads(threads)  # OpenCV (image layout) reads no variable: told directly
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(threads)
        except Exception:  # noqa: BLE001 - an old or stubbed torch: the variables still apply
            pass
