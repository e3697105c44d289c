"""Beats: a running task's progress, written into its running/ entry now and then, read by `status`.

On Kubernetes or Slurm the run directory is the only view of a run. A running/ entry alone says that
a task started, not whether it still moves: a task of hours and a hung one look the same. So while a
task runs, its running/ file holds one small JSON record (samples read and written, bytes, output
parts committed, the time), replaced every `SHARDFLOW_HEARTBEAT` seconds:

    running/000017.<start_ms>.<worker>   {"v": 1, "at": 1764200000.5, "every": 30, "attempt": 1,
                                          "samples_in": 1200, "samples_out": 1198, ...}

Why this shape:
- One owner of the interval: `heartbeat_seconds()` (the environment's SHARDFLOW_HEARTBEAT, default
  30 s, 0 turns beats off) is what pod logs' progress lines and the driver's heartbeat default read too.
- Off the per-sample path: one thread per process (`_Beater`) wakes when the next beat is due and reads
  the counters the task updates anyway (Stats, the writer's receipts, the input's byte count).
- Cheap on object stores: one PUT per interval per running task, and none for a task shorter than the
  interval (its running/ entry is written once, when it starts, as before). At 30 s, 1,000 tasks running
  cost 33 PUTs/s; a 100k-task run of 1-minute tasks adds ~2 PUTs a task to the 3 its records cost.
- Atomic: RunDir.write_bytes (temp + rename locally, one PUT on object stores): a reader sees the last
  beat or the one before, never a torn one. The running entry keeps its name, so its removal when the
  task ends (records.TaskClock.ended) is unchanged; a beat never recreates an entry that was removed.
- The record carries its own interval, so a reader judges staleness without knowing the workers'
  settings: no beat for STALE_BEATS intervals means the task is hung or its worker was killed.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_HEARTBEAT_S = 30.0
STALE_BEATS = 3  # beats missed before `status` says "no progress"
BEATS_READ = 100  # running entries whose beat `status` reads (one GET each on object stores)
_COUNTS = ("samples_in", "samples_out", "dropped", "skipped", "failed", "bytes_in", "bytes_out", "shards_in",
           "parts")


def heartbeat_seconds() -> float:
    """THE heartbeat interval: SHARDFLOW_HEARTBEAT from the environment (manifests and `--env` set it in
    pods; local workers inherit it), default 30 s; 0 turns beats off; a bad value falls back to 30 s."""
    try:
        every = max(0.0, float(os.environ.get("SHARDFLOW_HEARTBEAT", DEFAULT_HEARTBEAT_S)))
    except ValueError:
        return DEFAULT_HEARTBEAT_S
    return every if math.isfinite(every) else DEFAULT_HEARTBEAT_S


@dataclass(frozen=True)
class Beat:
    """What a running task had done at `at` (epoch seconds); `every`: its interval (0: beats off)."""

    at: float
    every: float
    attempt: int = 1
    moved: float = 0.0  # when the counts last changed (a live but hung task beats with the same counts)
    samples_in: int = 0
    samples_out: int = 0
    dropped: int = 0
    skipped: int = 0
    failed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0  # of the parts committed
    shards_in: int = 0  # inputs finished
    parts: int = 0  # output parts committed

    def to_bytes(self) -> bytes:
        """The record as compact JSON, formatted directly (every task start writes one: a third of
        json.dumps's CPU); numbers only, so nothing needs quoting."""
        counts = ",".join(f'"{name}":{int(getattr(self, name))}' for name in _COUNTS)
        return (f'{{"v":1,"at":{self.at:.3f},"every":{float(self.every)!r},"attempt":{int(self.attempt)},'
                f'"moved":{self.moved or self.at:.3f},{counts}}}').encode()

    def to_json(self, start: float, now: float) -> dict[str, Any]:
        return {"at": round(self.at, 3), "age": round(max(now - self.at, 0.0), 1), "every": self.every,
                "attempt": self.attempt, "rate": round(self.rate(start), 2), "stale": self.stale(now),
                "idle": round(self.idle(now), 1), "beats_stopped": self.beats_stopped(now),
                **{name: getattr(self, name) for name in _COUNTS}}

    def is_first(self, start: float) -> bool:
        """The beat the running entry was created with (no progress reported yet); both times are
        rounded to the millisecond, by different roundings."""
        return self.at - start < 0.002

    def rate(self, start: float) -> float:
        """Samples read per second since the task started (0 before the first beat with samples)."""
        return self.samples_in / (self.at - start) if self.at > start else 0.0

    def idle(self, now: float) -> float:
        """Seconds since the counts last changed, as far as the last beat knows (or since it was written)."""
        return max(now - (self.moved or self.at), 0.0)

    def stale(self, now: float) -> bool:
        """No progress for STALE_BEATS intervals: no beat came (the worker was killed or froze), or beats
        came with the same counts (the task hangs, or one sample takes that long). Never with beats off."""
        return self.every > 0 and self.idle(now) > STALE_BEATS * self.every

    def beats_stopped(self, now: float) -> bool:
        """No beat at all for STALE_BEATS intervals: the worker is gone or frozen (not merely a slow sample)."""
        return self.every > 0 and now - self.at > STALE_BEATS * self.every


def parse_beat(data: bytes | str | None) -> Beat | None:
    """The beat a running/ file holds; None for an empty file (an older shardflow) or anything else.
    The file is data to a reader (a run directory anyone may have written): only numbers are taken."""
    if not data:
        return None
    try:
        raw = json.loads(data)
        return Beat(float(raw["at"]), max(0.0, float(raw["every"])), int(raw.get("attempt", 1)),
                    float(raw.get("moved", raw["at"])), **{name: int(raw.get(name, 0)) for name in _COUNTS})
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None


class Beating(Protocol):
    """What the beat thread drives: a task's clock (records.TaskClock)."""

    every: float
    due: float

    def beat(self) -> None: ...


class _Beater:
    """One daemon thread per process that calls each registered clock's beat() when it is due.

    One thread for all tasks of a process (Dask and Ray run several in threads): a task costs a set
    insertion and removal, not a thread start. A forked worker makes its own (threads do not survive
    a fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.clocks: set[Beating] = set()
        self.wake = threading.Condition()
        self.wake_at = 0.0  # when the thread wakes next: a task due later costs it no wake-up
        self.closed = False  # set by stop_idle_beats: the thread ends, the next task makes a new beater
        self.thread = threading.Thread(target=self._loop, daemon=True, name="shardflow-beats")
        self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.wake:
                if self.closed:
                    return
                now = time.time()
                due = [c for c in self.clocks if c.due <= now]
                for clock in due:
                    clock.due = now + clock.every
                if not due:
                    self.wake_at = min((c.due for c in self.clocks), default=now + 3600)
                    self.wake.wait(max(self.wake_at - now, 0.01))
                    continue
            for clock in due:  # outside the lock: a slow PUT delays no registration
                try:
                    clock.beat()
                except Exception:  # noqa: BLE001 - a beat is a view: it must never fail or stop a task
                    pass


_BEATER: _Beater | None = None
_BEATER_LOCK = threading.Lock()


def start_beats(clock: Beating) -> None:
    """Have `clock.beat()` called every `clock.every` seconds from `clock.due` on (until stop_beats)."""
    global _BEATER
    while True:
        with _BEATER_LOCK:
            if _BEATER is None or _BEATER.pid != os.getpid():
                _BEATER = _Beater()
            beater = _BEATER
        with beater.wake:
            if beater.closed:  # ended by stop_idle_beats between the two locks: the next one
                continue
            beater.clocks.add(clock)
            if clock.due < beater.wake_at:  # tasks in a row: the thread already wakes before this one is due
                beater.wake.notify()
            return


def stop_idle_beats(timeout: float = 2.0) -> None:
    """End this process's beat thread if no task of the process is running. A driver that ran its tasks
    itself (the serial backend) calls it at the end of the run, so that no thread of shardflow's stays
    behind in the user's process (a notebook, a test); pool workers keep theirs for their next task."""
    global _BEATER
    with _BEATER_LOCK:
        beater = _BEATER
        if beater is None or beater.pid != os.getpid():
            return
        with beater.wake:
            if beater.clocks:
                return
            beater.closed = True
            beater.wake.notify()
        _BEATER = None
    beater.thread.join(timeout)


def stop_beats(clock: Beating) -> None:
    beater = _BEATER
    if beater is not None and beater.pid == os.getpid():
        with beater.wake:
            beater.clocks.discard(clock)
