"""Issue 11: the FIRST Ctrl-C starts nothing new and aborts the running tasks within a second or two
(temp outputs removed), with a real `shardflow run` subprocess and real signals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.support.jobs import cli_popen, make_shards, spec, tars, temp_files, write_job

SLOW_JOB = """
    import time

    def process(sample):
        time.sleep(0.25)
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""
SHARDS, PER_SHARD = 8, 24  # 6 s per task: finishing the running and the queued tasks would take 12 s or more


def _wait_until_workers_write(out: Path, process, timeout: float = 60) -> None:
    """Until each of the 2 workers has a task's temp shard open (mid-task)."""
    deadline = time.monotonic() + timeout
    while len(temp_files(out)) < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run wrote nothing"
        time.sleep(0.05)
    time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["terminal", "driver-only"])
def test_first_ctrl_c_aborts_running_tasks_and_starts_no_queued_one(tmp_path, how):
    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = write_job(tmp_path, SLOW_JOB, "slow.py")
    out = tmp_path / "out"
    process = cli_popen("run", job, "-i", spec(tmp_path / "in", "in", SHARDS), "-o", out / "{name}.tar",
                        "--workers", "2", "--no-progress", start_new_session=True)
    _wait_until_workers_write(out, process)
    workers = psutil.Process(process.pid).children(recursive=True)
    started = time.monotonic()
    if how == "terminal":
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: driver and workers at once
    else:
        process.send_signal(signal.SIGINT)  # kill -INT PID: the driver has to stop its workers itself
    _, err = process.communicate(timeout=60)
    took = time.monotonic() - started
    assert process.returncode == 130, err
    assert took < 3.0, f"the first Ctrl-C took {took:.1f} s"
    assert "interrupted with 0 of 8 tasks done" in err
    assert temp_files(out) == [] and tars(out) == []  # running tasks discarded, no queued task started
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
