"""Worker processes of the processes backend that die (backends.pool_calls): the task on the dead worker
is retried alone and fails after `io_retries` deaths, naming its shard; the tasks in flight beside it and
the rest finish in the same run; a rerun of that task alone still runs in a worker (a crash there must
not take the driver); workers that die before any task stop the run instead of being replaced forever.
Real worker processes; the scripts run in their own interpreters (a crash in a driver would end pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shardflow as sf
from tests.support.jobs import cli_env, keys_in, make_shards, spec, tars, temp_files

SCRIPT = """
import json, os, sys, time

import shardflow as sf


def crash_on_one_sample(sample):
    if sample["__key__"] == "s000007":  # the second sample of shard 3: like a native crash on one bad image
        os._exit(3)
    time.sleep(0.05)
    return {"__key__": sample["__key__"], "jpg": sample["jpg"]}


if __name__ == "__main__":
    job = sf.ShardJob(crash_on_one_sample, sys.argv[1], "out/{name}.tar", io_retries=1)
    report = job.run("processes", workers=2, progress=False)
    print(json.dumps({"failed": report.failed, "done": report.done, "skipped": report.skipped, "pid": os.getpid()}))
"""


def _run(tmp_path, inputs: str) -> dict:
    done = subprocess.run([sys.executable, "job.py", inputs], capture_output=True, text=True, cwd=tmp_path,
                          env=cli_env(), timeout=300)
    assert done.returncode == 0, done.stderr  # the driver lives through every crash
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow  # two runs of a pool replaced twice each
def test_a_worker_that_dies_on_one_sample_fails_its_task_alone_run_after_run(tmp_path):
    make_shards(tmp_path / "in", 8, 2)
    (tmp_path / "job.py").write_text(SCRIPT)
    inputs = spec(tmp_path / "in", "in", 8)
    first = _run(tmp_path, inputs)
    assert set(first["failed"]) == {"3"} and first["done"] == 7, first  # its neighbours in flight finished
    error = first["failed"]["3"]["error"]
    assert "worker process died" in error and "exit code 3" in error and "in-000003.tar" in error, error
    assert "2 times (io_retries=1)" in error and "__main__" not in error, error  # no startup hint: tasks ran
    counts = keys_in(tars(tmp_path / "out"))
    assert len(counts) == 14 and set(counts.values()) == {1} and not temp_files(tmp_path / "out")
    running = tmp_path / "out" / "_shardflow" / "running"
    assert not running.exists() or not any(running.iterdir())  # no task shown running on a dead worker
    failed = json.loads((tmp_path / "out" / "_shardflow" / "failed" / "000003.json").read_text())
    assert failed["error"] == error and failed["kind"] == "io"

    again = _run(tmp_path, inputs)  # the one task left: in a worker (not the driver), failing the same way
    assert set(again["failed"]) == {"3"} and again["skipped"] == 7, again
    assert "in-000003.tar" in again["failed"]["3"]["error"]


class _DiesWhenUnpickled:
    """A job function that ends any process that unpickles it: workers die before their first task."""

    def __call__(self, sample):
        return sample

    def __reduce__(self):
        return (os._exit, (3,))


def test_workers_that_die_before_any_task_stop_the_run(tmp_path):
    make_shards(tmp_path / "in", 6, 1)
    job = sf.ShardJob(_DiesWhenUnpickled(), spec(tmp_path / "in", "in", 6), str(tmp_path / "out" / "{name}.tar"))
    report = job.run("processes", workers=2, progress=False)  # returns: no pool after pool
    assert report.failed and report.done == 0, report
    assert all("died before starting any task" in f["error"] for f in report.failed.values()), report.failed
    assert len(report.failed) <= 4  # the calls that were in flight
