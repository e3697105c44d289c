"""`status` says when a run's driver is gone (killed on this host, or its lease expired), shows no ETA
for it, and `status --watch` stops then with exit status 1 instead of polling forever."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import tarfile
import time
from io import BytesIO
from pathlib import Path

import pytest

from shardflow.cli.status_watch import watch
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.lease import RunLease
from shardflow.rundir.pids import process_identity
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.status import read_status
from shardflow.tools import report_page
from tests.support.jobs import cli, cli_popen


def keep(sample: dict) -> dict:
    return sample


def _shards(folder: Path, shards: int, per_shard: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tarfile.open(folder / f"in-{s}.tar", "w") as tar:
            for i in range(per_shard):
                info = tarfile.TarInfo(f"s{s}-{i:03d}.txt")
                info.size = 1
                tar.addfile(info, BytesIO(b"x"))
    return f"{folder}/in-{{0..{shards - 1}}}.tar"


def _planned(tmp_path: Path) -> str:
    """A planned run directory (3 tasks, none run): the state a driver killed at its start leaves."""
    job = ShardJob(keep, _shards(tmp_path / "in", 3, 2), str(tmp_path / "out" / "{name}.tar"))
    return job.prepare().url


def _dead_pid() -> int:
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return child


def test_a_lease_whose_process_is_gone_says_so_and_ends_the_watch(tmp_path):
    url = _planned(tmp_path)
    pid = _dead_pid()  # a driver of this host and PID namespace, SIGKILLed: its lease.json stays behind
    lease = {"token": "dead", "user": "bob", **process_identity(), "pid": pid, "started": None,
             "expires": time.time() + 600, "ttl": 60}
    Path(url, "lease.json").write_text(json.dumps(lease))
    status = read_status(url)
    assert status.driver_gone is not None and f"bob@{lease['host']} pid {pid} ended without releasing" in \
        status.driver_gone
    assert status.driver_gone in str(status) and status.to_json()["driver_gone"] == status.driver_gone
    data, page = report_page.build(url, samples=0)  # the report page says it too
    assert data["driver_gone"] == status.driver_gone and html.escape(status.driver_gone) in page
    shown: list[str] = []
    assert watch(lambda: read_status(url), 0.1, terminal=False, echo=shown.append) == 1
    assert shown[-2] == status.driver_gone and shown[-1].startswith("stopped watching: the 3 tasks not done")


def test_an_expired_lease_says_so_and_a_live_one_says_nothing(tmp_path):
    url = _planned(tmp_path)
    holder = RunLease(RunDir(url), ttl=0.5)
    holder.acquire()
    try:
        assert read_status(url).driver_gone is None  # a live driver of this process: nothing to say
        holder._stop.set()  # paused (or on a host whose pid says nothing here): no renewal while it expires
        time.sleep(0.6)
        gone = read_status(url).driver_gone
        assert gone is not None and "expired" in gone and "renews its lease no more" in gone
    finally:
        holder.release()
    assert read_status(url).driver_gone is None  # released (a run that ended, or not started): cannot tell


@pytest.mark.slow
def test_status_watch_of_a_sigkilled_run_stops_with_no_eta(tmp_path):
    inputs = _shards(tmp_path / "in", 3, 10)
    (tmp_path / "slow.py").write_text("import time\n\ndef process(sample):\n    time.sleep(0.2)\n    return sample\n")
    run_dir = tmp_path / "out" / "_shardflow"
    driver = cli_popen("run", tmp_path / "slow.py", "-i", inputs, "-o", tmp_path / "out" / "{name}.tar",
                       "-b", "serial", "--no-progress")
    try:
        deadline = time.time() + 60
        while not list(run_dir.glob("records/*")):
            assert time.time() < deadline and driver.poll() is None, driver.communicate()
            time.sleep(0.05)  # task 0 done: a rate, so an ETA would be shown
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate()
    try:
        watched = cli("status", run_dir, "--watch", "--interval", "0.2", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("status --watch of a killed run never ended")
    assert watched.returncode == 1, watched.stderr
    assert "ended without releasing the run (killed?)" in watched.stdout and "ETA" not in watched.stdout
    assert watched.stdout.splitlines()[-1].startswith("stopped watching")
