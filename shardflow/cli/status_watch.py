"""`shardflow status --watch` and the exit status of `shardflow status`.

Exit status (documented in `shardflow status --help` and docs): 0 no task failed (the run may still
be going on), 1 some task failed (`status` reports it), 2 the run directory cannot be read; with
`--check`, also 1 while any task is not done, so `shardflow status --check RUN_DIR && next-step`
proceeds only after a complete run.

The watch reads the run directory every interval (listings only: rundir.status) and keeps what it
saw between polls: the failed tasks already shown, so each new failure is printed once, as it
happens. On a terminal it redraws the whole status (running tasks with worker, age and last beat, rate,
ETA); otherwise it prints one line per poll (the first running tasks with their samples so far). It
ends when no task is left to run (done or failed), or, with exit status 1 and a last line saying so,
when status can tell the run's driver is gone (rundir.status.driver_gone: killed on this host, or its
lease expired) with tasks left: no one will run them, so there is nothing more to wait for.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import click

from shardflow.cli.common import EXIT_FAILED, EXIT_OK
from shardflow.rundir.status import RunStatus, duration
from shardflow.text import safe


def exit_code(status: RunStatus, *, check: bool) -> int:
    """EXIT_FAILED when a task failed (or, with check, when the run is not complete); else EXIT_OK."""
    if status.failed_ids or (check and not status.complete):
        return EXIT_FAILED
    return EXIT_OK


def ended(status: RunStatus) -> bool:
    """No task is left to run: each is done or failed."""
    return len(status.done) + status.failed_count >= status.tasks


def line(status: RunStatus) -> str:
    """One line of the watch's log form: counts, then (while running) the running tasks, rate and ETA."""
    s = status.stats
    text = (f"{time.strftime('%H:%M:%S')} {len(status.done)}/{status.tasks} tasks done, {status.failed_count} failed, "
            f"{len(status.pending)} pending; {s.samples_in} samples in done tasks, {status.error_count} sample errors")
    tally = status.tally
    if tally is None or ended(status):
        return text
    tasks_s, samples_s, _ = tally.rate()
    eta = None if status.driver_gone else tally.eta()
    running = ", ".join(f"task {r.task} on {safe(r.worker, 80)} for {duration(tally.read_at - r.start)}"
                        f"{_beat_brief(r, tally.read_at)}" for r in tally.running[:3])
    more = f" and {len(tally.running) - 3} more" if len(tally.running) > 3 else ""
    return (text + (f"; running: {running}{more}" if running else "") + f"; {samples_s:.1f} samples/s"
            + (f", ETA {duration(eta)}" if eta is not None else ""))


def _beat_brief(entry: Any, now: float) -> str:
    """A running task's last beat in a few words: " (1200 samples, 9.6/s)", or status's stale note."""
    beat = entry.beat
    if beat is not None and beat.stale(now):
        return f" [no progress for {duration(beat.idle(now))} (hung or killed?)]"
    if beat is None or beat.is_first(entry.start):
        return ""
    return f" ({beat.samples_in} samples, {beat.rate(entry.start):.1f}/s)"


def watch(read: Callable[[], RunStatus], interval: float, *, check: bool = False,
          echo: Callable[[str], None] = click.echo, terminal: bool | None = None) -> int:
    """Poll until no task is left to run (or Ctrl-C: 0); returns the exit status of the last poll, 1 when
    the driver is gone with tasks left."""
    terminal = sys.stdout.isatty() if terminal is None else terminal
    seen_failed: set[int] = set()
    status: Any = None
    try:
        while True:
            status = read()
            new = [t for t in status.failed_ids if t not in seen_failed]
            seen_failed.update(new)
            if terminal:
                click.clear()
                echo(str(status))
            else:
                echo(line(status))
            for task_id in new:  # each failure once, as it happens
                record = status.failed.get(task_id) or {}
                error = safe(record.get("error", "(not read)"), 500)
                echo(f"FAILED task {task_id} [{record.get('kind', '?')}]: {error}")
            if ended(status):
                return exit_code(status, check=check)
            if status.driver_gone:
                if not terminal:  # the redrawn status already ends with it
                    echo(status.driver_gone)
                echo(f"stopped watching: the {len(status.pending)} tasks not done will not run until the run's "
                     "command runs again")
                return EXIT_FAILED
            time.sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK
