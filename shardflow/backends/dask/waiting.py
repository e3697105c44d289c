"""Waiting for Dask workers: a scheduler with none would otherwise hold the run silently forever.

`wait_for_workers` returns as soon as the scheduler has a worker thread; meanwhile it says so on
stderr after a few seconds and keeps saying how long it has waited, and with a limit
(`--wait-workers SECONDS`, `wait_workers=`) it gives up with a JobError naming the scheduler.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from shardflow.errors import JobError

FIRST_NOTICE = 5.0  # seconds without workers before the first message
NOTICES_EVERY = 30.0  # then one message per this many seconds


def _threads(client: Any) -> int:
    try:
        return sum(client.nthreads().values())
    except Exception:  # noqa: BLE001 - a scheduler that does not answer counts as no workers yet
        return 0


def wait_for_workers(client: Any, scheduler: str, limit: float | None = None, *, poll: float = 0.5,
                     out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
    """Block until the scheduler at `scheduler` has a worker; JobError after `limit` seconds (None: never)."""
    out = out or sys.stderr
    started = clock()
    notice = FIRST_NOTICE if limit is None else min(FIRST_NOTICE, limit)
    while _threads(client) == 0:
        waited = clock() - started
        if limit is not None and waited >= limit:
            raise JobError(f"no Dask worker joined the scheduler at {scheduler} in {waited:.0f} s (--wait-workers "
                           f"{limit:g}): start workers with `dask worker {scheduler}`, or check that they reach it")
        if waited >= notice:
            until = f"; giving up after {limit:g} s" if limit is not None else " (--wait-workers SECONDS sets a limit)"
            print(f"shardflow: the Dask scheduler at {scheduler} has no workers; waited {waited:.0f} s so far{until}",
                  file=out, flush=True)
            notice += NOTICES_EVERY if notice >= FIRST_NOTICE else FIRST_NOTICE
        time.sleep(poll)
