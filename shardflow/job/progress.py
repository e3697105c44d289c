"""Live progress of a run: samples done / total, samples/s, errors, tasks and an ETA, on every backend.

Backends feed one object the same way: `add_samples(n)` while tasks run (run_task reports counts
every half second: directly in serial runs, through a queue from worker processes, as Dask events),
`task_finished(result)` when one ends. On a terminal it draws a tqdm bar over samples; otherwise
(CI, pod logs, `| tee`) a heartbeat thread prints one line every `heartbeat` seconds to stderr:

    shardflow: 1200/4000 samples (30%), 3/10 tasks, 250 samples/s, 2 sample errors, 0 failed tasks, ETA 0:00:11

The total is known when the inputs have a manifest (a `_shardflow*/summary.json` beside them, from the
run that wrote them: `known_total`); otherwise it is estimated from the samples per finished task
(shown with `~`) once a task of this run has finished.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Callable, TextIO

from tqdm import tqdm

from shardflow.rundir.beats import DEFAULT_HEARTBEAT_S  # the interval's one owner (re-exported here)
from shardflow.rundir.layout import summary_beside
from shardflow.rundir.tasks import Task, TaskResult


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts finished tasks and processed samples; draws a bar, prints heartbeat lines, or stays quiet.

    `enabled`: True (bar), False (nothing), None (a bar on a terminal, heartbeat lines otherwise).
    `total_samples`: the samples of the pending tasks when known (None: estimated as tasks finish).
    """

    def __init__(self, total: int, initial: int, *, enabled: bool | None = None,
                 total_samples: int | None = None, heartbeat: float | None = DEFAULT_HEARTBEAT_S,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        terminal = self.stream.isatty()
        self.tasks, self.tasks_done, self.pending = total, initial, total - initial
        self.samples = 0
        self.samples_of_finished = 0  # samples read by the tasks of this run that ended
        self.finished_here = 0
        self.failed_tasks = 0
        self.sample_errors = 0
        self.known_total = total_samples
        self._started = time.perf_counter()
        self._lock = threading.Lock()
        self._bar = tqdm(total=total_samples, unit="sample", dynamic_ncols=True, file=self.stream,
                         disable=not (enabled or (enabled is None and terminal)), mininterval=0.5)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if enabled is None and not terminal and heartbeat:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat,), daemon=True,
                                          name="shardflow-heartbeat")
            self._beat.start()

    # -- fed by the backends ---------------------------------------------------------------------------
    def add_samples(self, count: int) -> None:
        with self._lock:
            self.samples += count
            self._bar.update(count)
            self._refresh()

    def task_finished(self, result: TaskResult) -> None:
        with self._lock:
            self.tasks_done += 1
            if result.status == "failed":
                self.failed_tasks += 1
            else:
                self.finished_here += result.status == "done"
                self.samples_of_finished += result.stats.samples_in if result.status == "done" else 0
            self.sample_errors += result.stats.failed
            if self.known_total is None and self._bar.total != self.estimated_total():
                self._bar.total = self.estimated_total()
            self._refresh()

    # -- what is shown ---------------------------------------------------------------------------------
    def estimated_total(self) -> int | None:
        """Samples of the pending tasks: known from manifests, else the mean of the finished ones x tasks."""
        if self.known_total is not None:
            return self.known_total
        if not self.finished_here:
            return None
        return max(self.samples, round(self.samples_of_finished / self.finished_here * self.pending))

    def line(self) -> str:
        """One heartbeat line (also what `str()` gives)."""
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        rate = self.samples / elapsed
        total = self.estimated_total()
        done = f"{self.samples} samples"
        eta = ""
        if total:
            approx = "" if self.known_total is not None else "~"
            done = f"{self.samples}/{approx}{total} samples ({min(100, 100 * self.samples // total)}%)"
            if rate > 0:
                eta = f", ETA {approx}{_clock(max(total - self.samples, 0) / rate)}"
        return (f"shardflow: {done}, {self.tasks_done}/{self.tasks} tasks, {rate:.0f} samples/s, "
                f"{self.sample_errors} sample errors, {self.failed_tasks} failed tasks{eta}")

    __str__ = line

    def _refresh(self) -> None:
        self._bar.set_postfix_str(f"tasks {self.tasks_done}/{self.tasks}, errors {self.sample_errors}, "
                                  f"failed tasks {self.failed_tasks}", refresh=False)

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            self._print_line()

    def _print_line(self) -> None:
        try:
            print(self.line(), file=self.stream, flush=True)
        except (OSError, ValueError):  # stderr closed: progress is best effort
            pass

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1)
            if time.perf_counter() - self._started >= 1:
                self._print_line()  # the last word, so a log shows where the run ended
        self._bar.close()


def known_total(tasks: list[Task], read_json: Callable[[str], Any], *, max_dirs: int = 8) -> int | None:
    """Samples in the inputs of `tasks`, from the summary.json a shardflow run left beside them.

    `read_json(url)` reads one file (None when missing); at most `max_dirs` input folders are looked
    at, and the total is given only when every input shard is listed.
    """
    folders = sorted({u.rpartition("/")[0] for t in tasks for u in t.inputs})
    if not tasks or len(folders) > max_dirs:
        return None
    counts: dict[str, int] = {}
    for folder in folders:
        summary = read_json(summary_beside(folder))
        for entry in (summary or {}).get("shards", []) if isinstance(summary, dict) else []:
            url = str(entry.get("url", ""))
            counts[f"{folder}/{url.rsplit('/', 1)[-1]}"] = int(entry.get("nsamples", 0))
    try:
        return sum(counts[u] for t in tasks for u in t.inputs)
    except KeyError:
        return None


def json_reader(options_for: Callable[[str], Any]) -> Callable[[str], Any]:
    """read_json for known_total: fsspec, None on any failure (a manifest is a hint, never required)."""

    def read(url: str) -> Any:
        from shardflow.storage.paths import filesystem

        try:
            fs, path = filesystem(url, options_for(url))
            return json.loads(fs.cat_file(path))
        except Exception:  # noqa: BLE001 - missing, unreadable or not JSON: no known total
            return None

    return read
