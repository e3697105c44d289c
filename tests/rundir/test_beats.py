"""A running task's beats in the run directory (rundir.beats): `shardflow status` shows its samples so far
while it runs, says when a task stops moving (hung, or its worker killed), and the entry goes when the
task ends. The job runs in a child process, held on a gate file, so no assertion depends on timing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shardflow.rundir.beats import Beat, parse_beat
from shardflow.rundir.layout import RUNNING, done_file
from shardflow.rundir.records import TaskClock
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.tools import report_page
from tests.support.jobs import cli, cli_env, make_shards, spec

HELD = """
import os, sys, time
import shardflow as sf

def held(sample):  # the samples after the third wait for the gate file
    if int(sample["__key__"][1:]) >= 3:
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.02)
    return {k: v for k, v in sample.items() if k != "__url__"}

if __name__ == "__main__":
    sf.ShardJob(held, sys.argv[1], sys.argv[2] + "/{name}.tar").run("serial", progress=False)
"""
RUNNING_LINE = re.compile(r"running task 0 on \S+ for [^:]+: (?P<rest>.*)")


def _start(tmp_path: Path, every: str = "0.2") -> tuple[subprocess.Popen, Path, Path]:
    make_shards(tmp_path / "in", 1, 6, size=(4, 4))
    script, gate, out = tmp_path / "held.py", tmp_path / "gate", tmp_path / "out"
    script.write_text(HELD)
    env = {**cli_env(), "SHARDFLOW_HEARTBEAT": every}
    child = subprocess.Popen([sys.executable, str(script), spec(tmp_path / "in", "in", 1), str(out), str(gate)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child, gate, out / "_shardflow"


def _status_until(run_dir: Path, wanted: str, child: subprocess.Popen | None = None) -> str:
    """`shardflow status RUN_DIR` polled until its running-task line contains `wanted`; that line."""
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        if (run_dir / "plan.json").exists():
            last = cli("status", str(run_dir)).stdout
            found = RUNNING_LINE.search(last)
            if found and wanted in found["rest"]:
                return found["rest"]
        if child is not None and child.poll() is not None:
            raise AssertionError(f"the job ended early: {child.communicate()}")
        time.sleep(0.1)
    raise AssertionError(f"no status said {wanted!r}; last:\n{last}")


def test_status_shows_a_running_tasks_samples_then_a_hang_then_the_entry_gone_when_done(tmp_path):
    child, gate, run_dir = _start(tmp_path)
    try:
        line = _status_until(run_dir, "samples read", child)
        assert int(re.search(r"(\d+) samples read", line)[1]) > 0
        assert not (run_dir / done_file(0)).exists()  # shown while the task runs, not from its marker
        beat = json.loads(cli("status", "--json", str(run_dir)).stdout)["progress"]["running"][0]["beat"]
        assert beat["samples_in"] == 4 and beat["samples_out"] == 3 and beat["bytes_in"] > 0
        # held on the gate: its beats keep coming with the same counts
        line = _status_until(run_dir, "no progress for", child)
        assert "(hung or killed?)" in line and "its worker still beats" in line
        watch = subprocess.Popen([sys.executable, "-m", "shardflow", "status", str(run_dir), "--watch", "--interval",
                                  "0.2"], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = watch.stdout.readline()  # its first poll, while the task is still held
        assert "running: task 0 on " in first and "[no progress for " in first, first
        gate.touch()
        assert child.wait(120) == 0, child.communicate()
        assert watch.wait(120) == 0 and "1/1 tasks done" in watch.communicate()[0].splitlines()[-1]
    finally:
        gate.touch()
        child.wait(120)
    final = cli("status", str(run_dir)).stdout
    assert "complete" in final and "running task" not in final and "no progress" not in final
    assert not list((run_dir / RUNNING).iterdir())  # the entry went with the task (records.TaskClock.ended)


def test_a_killed_workers_last_beat_is_shown_stale(tmp_path):
    child, gate, run_dir = _start(tmp_path)
    try:
        _status_until(run_dir, "samples read", child)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(60)
        line = _status_until(run_dir, "no beat for")
        assert "no progress for" in line and "(hung or killed?)" in line and "4 samples read" in line
        data = report_page.write(str(run_dir), str(tmp_path / "report.html"))  # the report page says it too
        beat = data["running"][0]["beat"]
        assert beat["stale"] and beat["beats_stopped"] and beat["samples_in"] == 4
        assert "(hung or killed?)" in (tmp_path / "report.html").read_text()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)
    assert list((run_dir / RUNNING).iterdir())  # nothing removed it: its age and last beat say what happened


def test_a_beat_never_recreates_the_entry_of_a_task_that_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "3600")  # the beat thread stays asleep: beats called here
    run_dir = RunDir(str(tmp_path / "rd"))
    clock = TaskClock(run_dir, 7)
    clock.follow(Stats(samples_in=5, samples_out=4))
    clock.beat()
    (entry,) = (tmp_path / "rd" / RUNNING).iterdir()
    beat = parse_beat(entry.read_bytes())
    assert beat is not None and beat.samples_in == 5 and beat.samples_out == 4 and beat.every == 3600
    clock.ended()
    clock.beat()  # the beat thread's last call, after the task ended
    assert not list((tmp_path / "rd" / RUNNING).iterdir())


def test_beats_off_with_zero_never_say_a_task_hangs(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "0")
    clock = TaskClock(RunDir(str(tmp_path / "rd")), 1)
    (entry,) = (tmp_path / "rd" / RUNNING).iterdir()
    beat = parse_beat(entry.read_bytes())
    assert beat is not None and beat.every == 0 and not beat.stale(time.time() + 10 ** 6)
    clock.ended()


@given(st.binary(max_size=300) | st.text(max_size=300))
def test_any_running_entry_content_parses_to_a_beat_or_none(data):
    """A running/ file is data to status (anyone may have written the run directory): never an error."""
    beat = parse_beat(data)
    assert beat is None or isinstance(beat, Beat)


@given(st.floats(0, 4e9), st.floats(0, 1e5), st.integers(0, 2 ** 40), st.integers(0, 2 ** 50))
def test_a_beat_reads_back_as_written(at, every, samples, nbytes):
    beat = Beat(at, every, 2, at, samples, samples, bytes_in=nbytes, parts=3)
    back = parse_beat(beat.to_bytes())
    assert back is not None and back.samples_in == samples and back.bytes_in == nbytes and back.parts == 3
    assert abs(back.at - at) < 1e-3 and back.every == every
