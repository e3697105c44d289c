"""Whether a process is still there: for workers that must end with their driver and for run-dir leases
whose driver may have been killed (a dead pid of this host frees the lease).

A pid alone names a process only inside one PID namespace of one boot of one kernel: containers on
host networking share the host name but not the pid numbers, and a reboot (or a long time) reuses
them. `process_identity` therefore records, beside host and pid, the kernel's boot id, the PID
namespace's inode and the process's start time; `provably_gone` says a recorded process is dead only
when all of them show it is this kernel's, this namespace's, and the pid is free or now another
process's. Anything it cannot check counts as alive.
"""

from __future__ import annotations

import os
import socket
from typing import Any


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


def boot_id() -> str | None:
    """The running kernel's boot id (Linux), None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace (`pid:[4026531836]`), None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): a pid reused by a
    later process has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_identity() -> dict[str, Any]:
    """What names this process beyond its pid: host, pid, boot id, PID namespace and start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "boot_id": boot_id(), "pid_ns": pid_namespace(),
            "started": start_ticks(pid)}


def provably_gone(record: dict[str, Any]) -> bool:
    """Whether the process a `process_identity()` record names is certainly dead: same host, same boot,
    same PID namespace as this process, and its pid is free (or taken by a process started later).
    A record from another namespace or boot, or one lacking those fields (older releases), is never
    judged: its pid means nothing here."""
    me = process_identity()
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("host") != me["host"]:
        return False
    if me["boot_id"] is None or me["pid_ns"] is None:
        return False
    if record.get("boot_id") != me["boot_id"] or record.get("pid_ns") != me["pid_ns"]:
        return False
    if not pid_alive(pid):
        return True
    started = record.get("started")
    return isinstance(started, int) and start_ticks(pid) not in (None, started)
