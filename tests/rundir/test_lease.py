"""Issue 26 items 5 and 18: the run directory's lease lets one driver run, whoever else tries.

(a) a driver in another PID namespace with the same host name (containers on host networking) must
not read the holder's pid as dead; (b) of several drivers taking over one dead driver's lease at the
same moment exactly one wins (local run dir and S3); (c) a driver paused past the TTL whose lease was
taken with --steal starts no further task and exits saying so; a torn lease.json is named as such.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardflow.rundir.layout import LEASE
from shardflow.rundir.lease import LeaseHeld
from shardflow.rundir.pids import process_identity
from tests.support.jobs import cli, cli_env, cli_popen, serial_job_setup, write_job

SLOW_JOB = """
    import os, time
    PARAMS = dict(sleep=0.5, log="")

    def process(sample):
        if PARAMS["log"]:
            with open(PARAMS["log"], "a") as f:
                f.write(f"{os.getpid()} {sample['__key__']}\\n")
        time.sleep(PARAMS["sleep"])
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _dead_lease() -> bytes:
    """The lease a driver of this host and namespace left when it was killed: its pid is free now."""
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    identity = {**process_identity(), "pid": child, "started": None}
    return json.dumps({"token": f"dead-{child}", "user": "bob", **identity, "expires": time.time() + 600,
                       "ttl": 60}).encode()


def _contend(url: str, options: dict | None, rounds: int, barrier, results) -> None:
    from shardflow.rundir.lease import LeaseHeld, RunLease
    from shardflow.rundir.run_dir import RunDir

    for _ in range(rounds):
        lease = RunLease(RunDir(url, options))
        barrier.wait()  # the dead driver's lease is in place: all at once
        try:
            lease.acquire()
            won = True
        except LeaseHeld:
            won = False
        results.put(won)
        barrier.wait()  # a winner stays alive (holding the lease) until every contender has tried
        lease._stop.set()


def _race(url: str, options: dict | None, write_lease, contenders: int, rounds: int, method: str) -> list[int]:
    """Winners per round of `contenders` processes taking over a dead driver's lease at once."""
    ctx = multiprocessing.get_context(method)
    barrier, results = ctx.Barrier(contenders + 1), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(url, options, rounds, barrier, results)) for _ in range(contenders)]
    for proc in procs:
        proc.start()
    winners = []
    try:
        for _ in range(rounds):
            write_lease(_dead_lease())
            barrier.wait(120)
            winners.append(sum(results.get(timeout=120) for _ in procs))
            barrier.wait(120)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return winners


@pytest.mark.slow
def test_of_drivers_taking_over_a_dead_lease_at_once_exactly_one_wins(tmp_path):
    run_dir = tmp_path / "_shardflow"
    run_dir.mkdir()
    winners = _race(str(run_dir), None, (run_dir / LEASE).write_bytes, 8, 12, "fork")
    assert winners == [1] * len(winners)


@pytest.mark.slow
def test_of_drivers_taking_over_a_dead_lease_on_s3_exactly_one_wins(s3_server, s3_bucket):
    url = f"{s3_bucket}/job/_shardflow"
    fs = s3_server.filesystem()

    def write(raw: bytes) -> None:
        fs.pipe_file(f"{url.removeprefix('s3://')}/{LEASE}", raw)

    winners = _race(url, s3_server.storage_options, write, 4, 12, "spawn")
    assert winners == [1] * len(winners)


@pytest.fixture()
def setup(tmp_path):
    return serial_job_setup(tmp_path, SLOW_JOB, "slow.py", 6, 1)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) to make a PID namespace")
def test_a_driver_in_another_pid_namespace_does_not_take_a_live_lease(setup):
    tmp_path, job, args, run_dir = setup
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {probe.stderr.decode().strip()}")
    holder = cli_popen("run", job, *args)
    try:
        _wait_for(run_dir / LEASE)
        # same host name, same kernel, its own pid numbers: the holder's pid does not exist in there
        other = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m",
                                "shardflow.cli", "run", str(job), *map(str, args)],
                               capture_output=True, text=True, env=cli_env(), timeout=120)
        assert other.returncode == 2, other.stderr
        assert "is in use by another driver" in other.stderr
        assert f"@{socket.gethostname()} pid {holder.pid} (expires in" in other.stderr
    finally:
        holder.kill()
        holder.wait(30)


DRIVER = """
    import sys
    import shardflow.rundir.lease as lease
    from shardflow.errors import JobError
    from shardflow.job.jobfile import load_job

    lease.DEFAULT_TTL = 2.0
    job = load_job(sys.argv[1], inputs=sys.argv[2], outputs=sys.argv[3], overrides={"log": sys.argv[4]})
    try:
        report = job.run("serial", progress=False, steal=sys.argv[5:] == ["--steal"])
    except JobError as exc:
        print(f"shardflow: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print("finished", report.ok)
"""


@pytest.mark.slow
def test_a_driver_paused_past_its_ttl_stops_when_its_lease_was_stolen(setup):
    tmp_path, job, args, run_dir = setup
    log = tmp_path / "calls.log"
    driver = write_job(tmp_path, DRIVER, "driver.py")
    command = [sys.executable, str(driver), str(job), args[1], args[3], str(log)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        _wait_for(run_dir / "done" / "000000.json")
        first.send_signal(signal.SIGSTOP)  # paused (a laptop lid, a SIGSTOP, a VM migration) past the TTL
        time.sleep(3)
        stolen = subprocess.run([*command, "--steal"], capture_output=True, text=True, env=cli_env(), timeout=120)
        assert stolen.returncode == 0, stolen.stderr
        resumed_at = len(log.read_text().splitlines())
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert first.returncode == 2, err
    assert "this driver's lease was taken by" in err and "stopped starting tasks" in err
    after = [line for line in log.read_text().splitlines()[resumed_at:] if line.startswith(f"{first.pid} ")]
    assert len(after) <= 1, after  # at most the sample it was in when paused; no new task started


def test_a_torn_lease_is_named_as_such(setup):
    tmp_path, job, args, run_dir = setup
    run_dir.mkdir(parents=True)
    (run_dir / LEASE).write_text('{"token": "x", "us')
    refused = cli("run", job, *args)
    assert refused.returncode == 2
    assert "?@?" not in refused.stderr
    assert "unreadable lease.json" in refused.stderr and "--steal" in refused.stderr


def _stolen_cannot_renew(url: str, options: dict) -> None:
    from shardflow.rundir.lease import LeaseLost, RunLease
    from shardflow.rundir.run_dir import RunDir

    holder = RunLease(RunDir(url, options), ttl=1.0)
    holder.acquire()
    holder._stop.set()  # paused: no renewal while the lease expires
    holder._thread.join(5)
    time.sleep(1.5)
    thief = RunLease(RunDir(url, options), steal=True)
    thief.acquire()
    try:
        assert holder.renew() is False  # its write is conditional on the version it wrote: refused
        assert json.loads(RunDir(url, options).read_bytes(LEASE))["token"] == thief.token
        with pytest.raises(LeaseLost, match="this driver's lease was taken by"):
            holder.check()
        late = RunLease(RunDir(url, options))
        with pytest.raises(LeaseHeld, match="is in use by another driver"):
            late.acquire()  # a live lease: refused (create-only and If-Match both fail)
    finally:
        thief.release()


@pytest.mark.slow
def test_on_s3_a_holder_whose_expired_lease_was_stolen_cannot_renew_it(s3_server, s3_bucket):
    _stolen_cannot_renew(f"{s3_bucket}/job/_shardflow", s3_server.storage_options)


@pytest.mark.slow
def test_on_gcs_a_holder_whose_expired_lease_was_stolen_cannot_renew_it(gcs_server, gcs_bucket):
    _stolen_cannot_renew(f"{gcs_bucket}/job/_shardflow", gcs_server.storage_options)
