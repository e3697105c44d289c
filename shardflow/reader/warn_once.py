"""Warnings the reader says once per process.

A reader's warnings (no GPU, shards split inside, a shard not cached) describe its setup, not a
sample: repeated in every epoch and every DataLoader worker they would drown the training log.
"""

from __future__ import annotations

import warnings

# messages already said in this process (a test clears it to see a warning again)
warned: set[str] = set()


def warn_once(message: str, category: type[Warning] = UserWarning, stacklevel: int = 3) -> None:
    """Warn with `message` unless this process has said it before (`stacklevel` as for warnings.warn,
    counted from the caller of warn_once's caller by default)."""
    if message not in warned:
        warned.add(message)
        warnings.warn(message, category, stacklevel=stacklevel)
