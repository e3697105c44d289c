"""CPU seconds for the benches: of this process, and of every process it started (the reaped ones,
and live ones such as a fork server, with the children those reaped: a pool's workers), so a
backend that works in other processes is charged for them."""

from __future__ import annotations

import resource


def own_cpu() -> float:
    """User + system seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def descendants_cpu() -> float:
    """User + system seconds of every process this one started, reaped or alive."""
    import psutil

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total
