"""Where the cores idle: a sampler of every process in a tree, from /proc/<pid>/task/*/schedstat.

For each process (summed over its threads) schedstat gives the nanoseconds it ran on a CPU and the
nanoseconds it was runnable but waiting for one (other load on a shared machine). Sampled every
`interval` seconds, a run splits per process into: ran, waited for a core (not ours to fix), and the
rest of its life: blocked (I/O, fsync, a lock, a queue) or idle (no task yet, the tail). The main
thread of a worker is reported apart, since that is where the job's samples are processed.

    with ProcessTree() as tree:
        run_something()
    print(tree.table(wall))
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


def _schedstat(pid: int, tid: int | None = None, threads: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting) of a thread, or of every thread of `pid`; `threads` keeps
    each thread's last figures, so threads that ended (a task's read and write threads) still count."""
    try:
        tids = [str(tid)] if tid is not None else os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    seen = threads if threads is not None else {}
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                a, b, _ = f.read().split()
        except (OSError, ValueError):
            continue
        seen[t] = (int(a), int(b))
    return sum(a for a, _ in seen.values()), sum(b for _, b in seen.values())


def _role(proc: psutil.Process, me: int) -> str:
    """driver, fork server, worker, or the command line's tail."""
    if proc.pid == me:
        return "driver"
    line = " ".join(proc.cmdline())
    if "forkserver" in line:
        return "fork server" if proc.ppid() == me else "worker"
    return line[-60:] or proc.name()


@dataclass
class Life:
    """One process seen by the sampler."""

    name: str
    first: float
    last: float
    ran: int = 0
    waited: int = 0
    main_ran: int = 0
    main_waited: int = 0
    base: tuple[int, int, int, int] = (0, 0, 0, 0)  # what the sampler's own process had spent before
    threads: dict[str, tuple[int, int]] = field(default_factory=dict)
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (time, CPU share over the interval)


class ProcessTree:
    """Samples this process and its descendants until stopped (a context manager)."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.lives: dict[int, Life] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="idle-profile")
        self.started = 0.0

    def __enter__(self) -> "ProcessTree":
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        try:  # processes that ran before (a Ray cluster started earlier) are not this run's
            before = {p.pid for p in me.children(recursive=True)}
        except psutil.Error:
            before = set()
        while not self._stop.is_set():
            now = time.perf_counter() - self.started
            try:
                procs = [me, *me.children(recursive=True)]
            except psutil.Error:
                procs = [me]
            for proc in procs:
                pid = proc.pid
                if pid in before:
                    continue
                life = self.lives.get(pid)
                ran, waited = _schedstat(pid, threads=life.threads if life is not None else None)
                main_ran, main_waited = _schedstat(pid, pid)
                if life is None:
                    try:
                        name = _role(proc, me.pid)
                    except psutil.Error:
                        continue
                    life = self.lives[pid] = Life(name, now, now)
                    ran, waited = _schedstat(pid, threads=life.threads)
                    if pid == me.pid:  # alive before the run: count from now
                        life.base = (ran, waited, main_ran, main_waited)
                        life.ran = ran
                    prev = life.ran
                else:
                    prev = life.ran
                if ran:
                    share = (ran - prev) / 1e9 / max(now - life.last, 1e-9) if life.timeline else 0.0
                    life.ran, life.waited = ran, waited
                    life.main_ran, life.main_waited = main_ran, main_waited
                    life.timeline.append((now, share))
                life.last = now
            self._stop.wait(self.interval)

    def table(self, min_cpu_s: float = 0.2) -> str:
        """One line per process that ran at least `min_cpu_s`: seconds alive, ran, waited, the rest."""
        lines = ["| process | alive s | ran s | waited for a core s | blocked or idle s | main thread: ran / waited / "
                 "blocked or idle s |", "|---|---:|---:|---:|---:|---:|"]
        for pid, life in sorted(self.lives.items(), key=lambda kv: kv[1].first):
            alive = life.last - life.first
            ran, waited = (life.ran - life.base[0]) / 1e9, (life.waited - life.base[1]) / 1e9
            if ran < min_cpu_s:
                continue
            main_ran, main_waited = (life.main_ran - life.base[2]) / 1e9, (life.main_waited - life.base[3]) / 1e9
            lines.append(f"| {pid} {life.name} | {alive:.1f} | {ran:.1f} | {waited:.1f} | {max(alive - ran, 0):.1f} | "
                         f"{main_ran:.1f} / {main_waited:.1f} / {max(alive - main_ran - main_waited, 0):.1f} |")
        return "\n".join(lines)

    def deciles(self) -> str:
        """Cores busy (the tree's CPU share) in each tenth of the run: where the start and the tail are."""
        points = self.busy_cores()
        if not points:
            return ""
        end = points[-1][0] or 1.0
        tenths = [[] for _ in range(10)]
        for t, busy in points:
            tenths[min(int(t / end * 10), 9)].append(busy)
        return "cores busy by tenth of the run: " + " ".join(
            f"{sum(v) / len(v):.2f}" if v else "-" for v in tenths)

    def busy_cores(self) -> list[tuple[float, float]]:
        """(time, cores busy summed over the tree) per sample: the run's CPU over time."""
        points: dict[float, float] = {}
        for life in self.lives.values():
            for t, share in life.timeline:
                key = round(t / self.interval) * self.interval
                points[key] = points.get(key, 0.0) + share
        return sorted(points.items())
