"""Whether a process is still there: for workers that must end with their driver and for run-dir leases
whose driver may have been killed (a dead pid of this host frees the lease)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed driver not yet reaped by its shell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True
