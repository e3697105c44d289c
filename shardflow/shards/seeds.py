"""Deterministic randomness: every seed derives from (a seed, sample key) by a stable hash.

One owner for both users of per-sample seeds, which are siblings that may not import each other: a
job's task (task/, the seed is the job's `seed`; task/seeds.py adds the device generator) and the
training reader (reader/, the seed is `stable_seed(dataset seed, epoch)`, so each epoch draws anew).
It sits in shards/ because a sample's key (shards/keys.py) is what the seed is made from.

The seed of the running code lives in a ContextVar, not a module global: two tasks running in
threads of one Dask worker each see their own. The process-wide generators (`random`, `numpy.random`,
torch's default generator) are shared by all threads of a process by nature; jobs that run several
tasks per process in threads should draw from `sample_rng(sample)`, which is private to the call.
"""

from __future__ import annotations

import _random
import contextlib
import hashlib
import random
import sys
from contextvars import ContextVar
from typing import Any, Iterator

import numpy as np

_job_seed: ContextVar[int] = ContextVar("shardflow_job_seed", default=0)


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from the parts' text, identical on every machine and Python version.

    Keys are data: a member name that is not UTF-8 (latin-1 file names) reaches here with its bytes
    surrogate-escaped, and is encoded back to those bytes rather than refused."""
    text = "\x1f".join([part if type(part) is str else str(part) for part in parts])  # str(a str) is itself
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def job_seed(seed: int) -> Iterator[None]:
    """Make `seed` the job seed of the code run inside the block (this thread / context only)."""
    token = _job_seed.set(seed)
    try:
        yield
    finally:
        _job_seed.reset(token)


def sample_seed(sample: dict[str, Any]) -> int:
    """The seed of this sample in the running job (or reader epoch): derived from (its seed, sample key)."""
    return stable_seed(_job_seed.get(), sample["__key__"])


def sample_rng(sample: dict[str, Any], kind: str = "numpy") -> Any:
    """A random generator for this sample: same key and job seed, same numbers, on any worker.

    kind: "numpy" (np.random.Generator), "python" (random.Random) or "torch" (torch.Generator).
    """
    seed = sample_seed(sample)
    if kind == "numpy":
        return np.random.default_rng(seed)
    if kind == "python":
        return random.Random(seed)
    if kind == "torch":
        import torch

        return torch.Generator().manual_seed(seed)
    raise ValueError(f"kind must be numpy, python or torch, not {kind!r}")


# `random.seed(n)` for an int n is Random.seed's Python wrapper around the C seeding, then
# `gauss_next = None`; done here without the wrapper's type checks (seed_globals runs once per sample:
# ~1 us of ~4). The generator's state is the one random.seed(n) leaves, bit for bit (tests/task/test_seeds.py).
_GLOBAL_RANDOM = random._inst  # type: ignore[attr-defined]  # the instance behind random.random() & co.
_SEED_C = _random.Random.seed


def seed_globals(seed: int, cuda: bool = True) -> None:
    """Seed the global generators too, so code that calls random/np.random/torch is reproducible.

    cuda=False leaves the CUDA generators alone: the reader's map= runs on the CPU, and in the
    training process (num_workers=0) reseeding CUDA per sample would reseed the model's dropout."""
    if type(seed) is int:
        _SEED_C(_GLOBAL_RANDOM, seed)
        _GLOBAL_RANDOM.gauss_next = None
    else:
        random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        # not torch.manual_seed: with CUDA not yet initialised it queues a lazy seeding call together
        # with a formatted stack trace (traceback + linecache stats), a few ms per sample
        torch.random.default_generator.manual_seed(seed)
        cuda_module = sys.modules.get("torch.cuda") if cuda else None
        if cuda_module is not None and cuda_module.is_initialized():
            cuda_module.manual_seed_all(seed)
