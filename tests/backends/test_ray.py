"""The Ray backend on a real Ray: a head started with `ray start --head` on 127.0.0.1 plus a second node
(`ray_head`), and a local Ray the backend starts and stops itself. What every backend promises
(exactly once, reruns, user bugs) is in test_exactly_once.py; here what is Ray's own: a worker process
that dies mid-task (os._exit, SIGKILL) has its task rerun and the outputs stay exactly once; setup runs
once per worker process; a job file, a Python job and the shell `map` tool run on Ray from the CLI.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from shardflow.job.shard_job import ShardJob
from tests.support.jobs import cli, cli_popen, keys_in, make_shards, tars, temp_files, write_job

pytestmark = pytest.mark.cluster

SHARDS, PER_SHARD = 4, 6


def _inputs(tmp_path: Path, shards: int = SHARDS) -> str:
    make_shards(tmp_path / "in", shards, PER_SHARD)
    return str(tmp_path / "in" / f"in-{{000000..{shards - 1:06d}}}.tar")


def _check_exactly_once(out: Path, samples: int = SHARDS * PER_SHARD) -> None:
    counts = keys_in(tars(out))
    assert set(counts) == {f"s{i:06d}" for i in range(samples)}
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
    assert temp_files(out) == []


def _first_time(path: str) -> bool:
    """True for the one caller that creates `path` (O_EXCL), whatever process or attempt it is."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class ExitOnFirstAttempt:
    """The worker process exits (os._exit) on the third sample of input shard 1, on the first attempt only:
    its task's first two samples are already in a temp shard then."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, sample):
        if sample["__key__"] == "s000008" and _first_time(self.flag):
            os._exit(1)
        sample["txt"] = b"ok"
        return sample


class HangOnFirstAttempt:
    """On the first attempt the sample s000014 (input shard 2) writes the worker's pid and waits to be killed."""

    def __init__(self, pidfile: str) -> None:
        self.pidfile = pidfile

    def __call__(self, sample):
        if sample["__key__"] == "s000014" and _first_time(self.pidfile + ".claimed"):
            with open(self.pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(self.pidfile + ".tmp", self.pidfile)
            time.sleep(120)
        sample["txt"] = b"ok"
        return sample


def test_a_worker_that_exits_mid_task_has_its_task_rerun_exactly_once(ray_head, tmp_path):
    out, flag = tmp_path / "out", tmp_path / "exited"
    job = ShardJob(ExitOnFirstAttempt, _inputs(tmp_path), f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"),
                   fn_args=(str(flag),))
    report = job.run("ray", address=ray_head.address, progress=False)
    assert flag.exists()  # the worker did exit once
    assert report.ok, report
    _check_exactly_once(out)


def test_a_worker_killed_with_sigkill_has_its_task_rerun_exactly_once(ray_head, tmp_path):
    out, pidfile = tmp_path / "out", tmp_path / "worker.pid"
    job = ShardJob(HangOnFirstAttempt, _inputs(tmp_path), f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"),
                   fn_args=(str(pidfile),))
    killed: list[int] = []

    def kill_when_hanging() -> None:
        deadline = time.monotonic() + 240
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if pidfile.exists():
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_when_hanging, daemon=True)
    killer.start()
    report = job.run("ray", address=ray_head.address, progress=False)
    killer.join(timeout=10)
    assert killed, "the hanging sample was never reached"
    assert report.ok, report
    _check_exactly_once(out)


class SetupLog:
    """A class fn: constructed once per worker process, each construction logged with its pid."""

    def __init__(self, log: str) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        self.pid = os.getpid()

    def __call__(self, sample):
        sample["txt"] = str(self.pid).encode()
        return sample


@pytest.mark.slow
def test_a_python_job_starts_and_stops_a_local_ray_and_sets_up_once_per_worker(tmp_path):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()  # this test is about the Ray the backend starts itself
    out, log = tmp_path / "out", tmp_path / "setups.log"
    shards = 8
    job = ShardJob(SetupLog, _inputs(tmp_path, shards), f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"),
                   fn_args=(str(log),))
    report = job.run("ray", workers=2, include_dashboard=False, progress=False)
    assert report.ok, report
    assert not ray.is_initialized()  # the local Ray it started is stopped again
    _check_exactly_once(out, shards * PER_SHARD)
    setups = Counter(log.read_text().split())
    assert set(setups.values()) == {1}, setups  # once per worker process
    assert len(setups) < shards  # worker processes were reused across tasks
    used = {s["txt"].decode() for shard in tars(out) for s in _samples(shard)}
    assert used <= set(setups)


def _samples(path: Path) -> list[dict]:
    from shardflow.shards.samples import read_samples

    return list(read_samples(str(path)))


JOB_FILE = '''"""a job file with setup(): once per worker process, logged with its pid."""
import os

LOG = {log!r}


def setup():
    with open(LOG, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    return {{"pid": os.getpid()}}


def process(sample, state):
    sample["txt"] = str(state["pid"]).encode()
    return sample
'''


def test_a_job_file_runs_on_the_cluster_from_the_cli_with_relative_paths(ray_head, tmp_path):
    log = tmp_path / "setups.log"
    write_job(tmp_path, JOB_FILE.format(log=str(log)), "pids.py")
    _inputs(tmp_path)
    result = cli("run", "pids.py", "--inputs", "in/in-{000000..000003}.tar", "--outputs", "out/{task:03d}.tar",
                 "--run-dir", "out/_run", "--backend", "ray", "--address", ray_head.address,
                 "--ray-arg", "num_cpus=1", "--no-progress", cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4/4 tasks done" in result.stdout
    _check_exactly_once(tmp_path / "out")
    setups = Counter(log.read_text().split())
    assert set(setups.values()) == {1}, setups


def test_the_shell_map_tool_runs_on_ray(ray_head, tmp_path):
    inputs = _inputs(tmp_path)
    out = tmp_path / "mapped"
    copy = 'for f in *.json; do cp "$f" "${f%.json}.copy"; done'
    result = cli("map", inputs, "-o", f"{out}/{{name}}.tar", "-c", copy, "--backend", "ray",
                 "--address", ray_head.address, "--no-progress", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_exactly_once(out)
    samples = [s for shard in tars(out) for s in _samples(shard)]
    assert samples and all(s["copy"] == s["json"] for s in samples)


def test_ray_args_are_for_the_ray_backend_only(tmp_path):
    _inputs(tmp_path)
    result = cli("map", str(tmp_path / "in" / "in-000000.tar"), "-o", str(tmp_path / "o" / "{name}"), "-c", "true",
                 "--backend", "processes", "--ray-arg", "num_cpus=2")
    assert result.returncode == 2, result
    assert "--backend ray" in result.stderr


SLOW_JOB = '''"""slow samples: each task runs for seconds, long enough to be stopped midway."""
import os
import time

STARTED = {started!r}


def process(sample):
    open(os.path.join(STARTED, str(os.getpid())), "w").close()
    time.sleep(0.7)
    return sample
'''


def test_ctrl_c_cancels_the_ray_tasks_in_flight(ray_head, tmp_path):
    started = tmp_path / "started"
    started.mkdir()
    write_job(tmp_path, SLOW_JOB.format(started=str(started)), "slow.py")
    inputs, out = _inputs(tmp_path), tmp_path / "out"
    proc = cli_popen("run", str(tmp_path / "slow.py"), "--inputs", inputs, "--outputs", f"{out}/{{task:03d}}.tar",
                     "--backend", "ray", "--address", ray_head.address, "--no-progress")
    try:
        deadline = time.monotonic() + 180
        while not any(started.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(started.iterdir()), "no task started"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    # a task runs for ~4 s: one that was not cancelled would finish and mark itself done meanwhile
    time.sleep(8)
    assert not list((out / "_shardflow" / "done").glob("*.json"))
    assert temp_files(out) == []  # the cancelled tasks aborted their temp shards
