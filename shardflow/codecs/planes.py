"""HWC -> CHW ("planes") for decoded images: OpenCV's SIMD channel split when it is installed.

Torch wants images channel-first, every decoder gives them channel-last. numpy's strided copy of a
uint8 image moves about 4 bytes a nanosecond: 48 us for a 256x256 RGB image, a quarter of the time
simplejpeg takes to decode it. `cv2.split` deinterleaves the channels with SIMD shuffles in ~6 us.
The bytes are the same either way; without OpenCV (`pip install "shardflow[fast]"` brings it)
numpy does it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_SPLIT_DTYPES = (np.uint8, np.uint16, np.float32)


_threads: int | None = None  # what limit_threads asked for, applied when OpenCV is imported


@functools.lru_cache(maxsize=None)
def _cv2() -> Any:
    try:
        import cv2
    except ImportError:  # also an OpenCV that cannot load its libraries
        return None
    if not hasattr(cv2, "split"):
        return None
    if _threads is not None:
        cv2.setNumThreads(_threads)
    return cv2


def preload() -> None:
    """Load OpenCV now (~15 ms), in a process about to fork DataLoader workers: each of them would
    otherwise load it on its first image, on the way to its first batch. The forked children still
    run it on the thread count they set (limit_threads; tests/codecs/test_planes.py checks both)."""
    _cv2()


def to_planes(hwc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`hwc` (H, W, C) as (C, H, W), written into `out` when given (C-contiguous planes)."""
    h, w, c = hwc.shape
    if out is None:
        out = np.empty((c, h, w), hwc.dtype)
    cv2 = _cv2()
    if cv2 is not None and 1 < c <= 4 and hwc.dtype in _SPLIT_DTYPES and out.dtype == hwc.dtype \
            and hwc.flags.c_contiguous and out[0].flags.c_contiguous:
        planes = [out[i] for i in range(c)]
        got = cv2.split(hwc, planes)
        if all(g is p for g, p in zip(got, planes)):
            return out
    out[...] = hwc.transpose(2, 0, 1)  # (no OpenCV, or it did not write into `out`)
    return out


def limit_threads(n: int = 1) -> None:
    """Keep OpenCV to `n` threads in a worker process, one of several running side by side (a split
    is too small to gain from threads: with two it took twice the CPU for the same wall time).
    Applied now if OpenCV is loaded, else when to_planes first loads it."""
    global _threads
    _threads = max(1, n)
    if _cv2.cache_info().currsize:
        cv2 = _cv2()
        if cv2 is not None:
            cv2.setNumThreads(_threads)
