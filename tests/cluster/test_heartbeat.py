"""Pods print progress lines while a task runs (issue 11: "Pods print per-chunk progress lines")."""

from __future__ import annotations

import time

from shardflow.cluster import contract
from shardflow.cluster.heartbeat import ChunkHeartbeat, heartbeat_seconds
from tests.cluster.test_worker import plan, run


def slow_identity(sample):
    time.sleep(0.15)
    return {k: v for k, v in sample.items() if k != "__url__"}


def test_a_running_task_prints_heartbeat_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "0.3")
    url, _ = plan(tmp_path, 2, fn=slow_identity)  # 2 tasks x 4 samples x 0.15 s
    code, log, _ = run(url, 0, 2)
    assert code == contract.EXIT_OK
    beats = [line for line in log.splitlines() if "running task" in line]
    assert beats, log
    assert beats[0].startswith("index 0: running task ") and "samples so far" in beats[0]
    assert log.index(beats[0]) < log.index("task 0: done") or any("running task 1" in b for b in beats)


def test_heartbeat_off_and_bad_values(monkeypatch):
    lines: list[str] = []
    beat = ChunkHeartbeat(3, 1, lambda out, text: lines.append(text), None, every=0)  # type: ignore[arg-type]
    beat.start_task(7)
    beat(10)
    assert lines == [] and beat.samples == 10
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "soon")
    assert heartbeat_seconds() == 30.0
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "0")
    assert heartbeat_seconds() == 0.0
