"""Issue 12, the run directory: one driver at a time (the lease), temp files of other programs left
alone, and a run directory is code: status, plan and worker --finalize never unpickle job.pkl."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import time
from pathlib import Path

import pytest

from shardflow.rundir.layout import LEASE
from tests.support.jobs import cli, cli_popen, serial_job_setup, tars

COPY_JOB = """
    import time
    PARAMS = dict(sleep=0.0)

    def process(sample):
        time.sleep(PARAMS["sleep"])
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""


@pytest.fixture()
def setup(tmp_path):
    return serial_job_setup(tmp_path, COPY_JOB, "copy.py", 2, 3)


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# -- 16: the lease ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_driver_is_refused_naming_the_holder(setup):
    tmp_path, job, args, run_dir = setup
    first = cli_popen("run", job, *args, "--set", "sleep=0.3")
    try:
        _wait_for(run_dir / LEASE)
        lease = json.loads((run_dir / LEASE).read_text())
        assert lease["pid"] == first.pid and lease["host"] == socket.gethostname()
        second = cli("run", job, *args, "--set", "sleep=0.3")
        assert second.returncode == 2, second.stderr
        assert "is in use by another driver" in second.stderr
        assert f"@{socket.gethostname()} pid {first.pid} (expires in" in second.stderr
        assert "Traceback" not in second.stderr
        # the holder killed outright: its lease names a dead process of this host, so a rerun takes over
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        again = cli("run", job, *args, "--set", "sleep=0.3")
        assert again.returncode == 0, again.stderr
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert len(tars(tmp_path / "out")) == 2
    assert not (run_dir / LEASE).exists()  # released at the end


def _foreign_lease(run_dir: Path, expires_in: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LEASE).write_text(json.dumps({
        "token": "x", "user": "bob", "host": "other-host.example", "pid": 4242, "expires": time.time() + expires_in,
        "ttl": 60}))


@pytest.mark.slow
def test_steal_takes_only_an_expired_lease(setup):
    tmp_path, job, args, run_dir = setup
    _foreign_lease(run_dir, 600)
    live = cli("run", job, *args, "--steal")
    assert live.returncode == 2 and "bob@other-host.example pid 4242 (expires in" in live.stderr
    _foreign_lease(run_dir, -5)
    refused = cli("run", job, *args)
    assert refused.returncode == 2 and "expired" in refused.stderr and "--steal" in refused.stderr
    taken = cli("run", job, *args, "--steal")
    assert taken.returncode == 0, taken.stderr
    assert len(tars(tmp_path / "out")) == 2


@pytest.mark.slow
def test_workers_do_not_take_the_lease(setup):
    tmp_path, job, args, run_dir = setup
    assert cli("plan", job, *args[:-2], "--run-dir", run_dir).returncode == 0
    planned = cli("k8s", job, *args[:-2], "--image", "x", "--run-dir", run_dir,
                  "--pvc", f"data:{tmp_path}")
    assert planned.returncode == 0, planned.stderr
    _foreign_lease(run_dir, 600)  # a driver elsewhere holds it; a pod still runs its index
    worker = cli("worker", "--run-dir", run_dir, "--index", "0")
    assert worker.returncode == 0, worker.stderr
    assert (run_dir / "done" / "000000.json").exists()


# -- 10: temp files of other programs ---------------------------------------------------------------


def test_run_dir_keeps_other_programs_temp_files(setup):
    tmp_path, job, args, run_dir = setup
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    foreign = [shared / ".db.tmp-journal", shared / "sub" / ".cache.tmp-x", shared / ".notes.tmp-1234abcd"]
    for path in foreign:
        path.write_text("not shardflow's")
    done = cli("run", job, *args, "--run-dir", shared)
    assert done.returncode == 0, done.stderr
    assert [p.exists() for p in foreign] == [True] * len(foreign)


# -- 21: a run directory is code; these commands never run it ---------------------------------------


class _Trap:
    """Unpickling this creates the file `path` (what a hostile job.pkl could do instead)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.mark.slow
def test_status_plan_and_finalize_never_unpickle_job_pkl(setup):
    tmp_path, job, args, run_dir = setup
    assert cli("run", job, *args).returncode == 0
    trap = tmp_path / "job.pkl-was-unpickled"
    (run_dir / "job.pkl").write_bytes(pickle.dumps(_Trap(str(trap))))
    status = cli("status", run_dir)
    plan = cli("plan", job, *args[:-2])
    final = cli("worker", "--run-dir", run_dir, "--finalize")
    assert (status.returncode, plan.returncode, final.returncode) == (0, 0, 0), (status.stderr, plan.stderr,
                                                                                   final.stderr)
    assert "holds this plan: 2 of 2 tasks done" in plan.stdout
    assert not trap.exists()
    # the trap works: unpickling job.pkl (what a worker of a Python-defined job does) springs it. (A pod of
    # this job-file job rebuilds the job from the source recorded in job.json and never unpickles it.)
    pickle.loads((run_dir / "job.pkl").read_bytes())
    assert trap.exists()
