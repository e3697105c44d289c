"""What map= (and a user collate_fn) draw at random: seeded per sample from (seed, epoch, key).

A training reader must give the same augmentation on a rerun, after a resume and whichever rank or
worker reads a sample, yet new augmentation each epoch. So each epoch has its own seed,
`stable_seed(dataset seed, epoch)`: it is the seed `sf.sample_rng(sample)` / `sf.sample_seed(sample)`
derive from while map= runs (the ContextVar of shards/seeds.py, as a job's task sets its job seed),
and the global generators (`random`, `numpy.random`, torch's CPU generator) are seeded from
(epoch seed, key) before each call, as run_task does for a job's fn. CUDA's generators are left
alone: map= runs on the CPU, and in the training process (num_workers=0) they drive the model.

In the training process (no DataLoader workers) the caller's own generator states are put back
around each item the reader hands out, so the training loop draws what it would draw without the
reader; a DataLoader worker process belongs to the reader, and is left as the last sample seeded it.
"""

from __future__ import annotations

import random
import sys
from typing import Any, Callable, Iterator

import numpy as np

from shardflow.shards.seeds import job_seed, seed_globals, stable_seed


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch of a dataset seeded `seed`: what sample seeds derive from."""
    return stable_seed(seed, epoch)


def call_seeded(fn: Callable[[Any], Any], arg: Any, seed: int, *parts: Any) -> Any:
    """fn(arg) with the global generators seeded from (`seed`, the epoch's, and *parts: the sample key,
    as a job's run_task seeds them from (job seed, key)), and `seed` the one sample_rng derives from."""
    seed_globals(stable_seed(seed, *parts), cuda=False)
    with job_seed(seed):
        return fn(arg)


def keeping_global_rngs(items: Iterator[Any]) -> Iterator[Any]:
    """The items of `items`, with the process's generator states as they were before each was made
    (the reseeding per sample stays inside the reader)."""
    try:
        while True:
            saved = _global_states()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                _restore(saved)
            yield item
    finally:
        items.close()  # type: ignore[attr-defined]


def _global_states() -> tuple[Any, Any, Any]:
    torch = sys.modules.get("torch")
    return random.getstate(), np.random.get_state(), \
        torch.random.default_generator.get_state() if torch is not None else None


def _restore(saved: tuple[Any, Any, Any]) -> None:
    python, numpy, torch_state = saved
    random.setstate(python)
    np.random.set_state(numpy)
    if torch_state is not None:
        sys.modules["torch"].random.default_generator.set_state(torch_state)
