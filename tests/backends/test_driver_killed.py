"""A driver killed with SIGKILL leaves no alarming noise behind: multiprocessing's resource tracker cleans
up the pool's semaphores (its job) without warning "There appear to be N leaked semaphore objects"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from shardflow.tools.demo import write_synthetic_shards

SLOW = "import time\n\n\ndef process(sample):\n    time.sleep(5)\n    return sample\n"


@pytest.mark.slow
def test_sigkill_of_the_driver_prints_no_leaked_semaphore_warning(tmp_path):
    write_synthetic_shards(tmp_path / "in", 2, 2, size=(16, 16))
    (tmp_path / "slow.py").write_text(SLOW)
    driver = subprocess.Popen([sys.executable, "-m", "shardflow", "run", "slow.py", "-i",
                               "in/train-{000000..000001}.tar", "-o", "out/{name}.tar", "--workers", "2",
                               "--no-progress"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out").glob(".*.tmp*")):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.2)  # the pool is up and a task is writing: its semaphores exist
    time.sleep(1.0)
    os.kill(driver.pid, signal.SIGKILL)
    _, err = driver.communicate(timeout=60)  # EOF once the tracker and the orphaned workers are gone too
    assert driver.returncode == -signal.SIGKILL
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err
