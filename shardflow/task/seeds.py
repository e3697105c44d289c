"""Deterministic randomness for jobs: every seed derives from (job seed, sample key) by a stable hash.

The seeding itself (stable_seed, the job seed ContextVar, sample_seed, sample_rng, seed_globals) has
one owner, shards/seeds.py, shared with the training reader (a sibling of task/); it is re-exported
here, where jobs have always imported it. This module adds the generator on the worker's device.
"""

from __future__ import annotations

from typing import Any

from shardflow.shards.seeds import job_seed, sample_rng, sample_seed, seed_globals, stable_seed

__all__ = ["device_rng", "job_seed", "sample_rng", "sample_seed", "seed_globals", "stable_seed"]


def device_rng(sample: dict[str, Any], device: Any = None) -> Any:
    """A torch.Generator for this sample on `device` (default: this worker's, "cuda" or "cpu"), seeded
    like sample_rng: random ops on the GPU (torch.rand(..., device=, generator=)) repeat on rerun.

    The global CUDA generators are seeded too (seed_globals, when CUDA is initialised), but a
    generator per sample does not depend on batching or on the order ops run in.
    """
    import torch

    if device is None:
        from shardflow.task.devices import worker_device

        device = worker_device()
    return torch.Generator(device=device).manual_seed(sample_seed(sample))
