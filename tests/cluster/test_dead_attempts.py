"""A task that kills its pod (cluster.dead_attempts): its dead attempts are counted from the running/
entries they left, it runs after the chunk's other tasks, and it fails (recorded, named) once it killed
more than io_retries processes; a duplicate pod's live attempt is not a dead one."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from shardflow.cluster import contract, worker
from shardflow.cluster.dead_attempts import DIED
from shardflow.job.jobfile import load_job
from shardflow.rundir.layout import RECORDS, RUNNING
from shardflow.rundir.records import mark_running, parse_record
from shardflow.rundir.run_dir import RunDir
from tests.support.jobs import write_job
from tests.support.k8s import input_keys, make_shards, output_keys, shardflow_command, temp_files

JOB = '''
"""Ends its process on one key (a native crash's stand-in); holds task 1 while a flag file exists
in a process started with HOLD=1 (a duplicate pod still running it)."""
import os
import time

PARAMS = dict(crash="", hold="")


def process(sample):
    if sample["__key__"] == PARAMS["crash"]:
        os._exit(3)
    if os.environ.get("HOLD") and sample["__key__"].startswith("s1/"):
        while os.path.exists(PARAMS["hold"]):
            time.sleep(0.05)
    return {k: v for k, v in sample.items() if k != "__url__"}
'''
OTHER_POD = "other-pod~index0~p7"  # a worker name of another host: its pid means nothing here


def planned(tmp: Path, **overrides) -> tuple[str, Path]:
    """A chunk of 3 one-shard tasks (4 samples each) planned from a job file (subprocesses load it)."""
    make_shards(tmp / "in", 3, 4)
    out = tmp / "out"
    job = load_job(write_job(tmp, JOB), inputs=str(tmp / "in" / "in-{000000..000002}.tar"),
                   outputs=f"{out}/{{name}}.tar", overrides=overrides)
    job.prepare()
    return job.run_dir, out


def worker_cmd(url: str) -> list[str]:
    return [*shardflow_command(), "worker", "--run-dir", url, "--index", "0", "--tasks-per-index", "3"]


def run_in_process(url: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = worker.run_chunk(url, 0, 3, out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def died_records(rd: RunDir) -> list[int]:
    records = filter(None, map(parse_record, rd.list_names(RECORDS)))
    return sorted(r.task for r in records if r.kind == DIED)


@pytest.mark.slow  # three worker processes in a row, as the index's restarts would run them
def test_a_task_that_kills_its_worker_fails_alone_after_io_retries_restarts(tmp_path):
    url, out = planned(tmp_path, crash="s1/k002", io_retries=1)
    codes = []
    for _ in range(1 + 1 + 1):  # the first run, io_retries restarts that die again, the one that gives up
        proc = subprocess.run(worker_cmd(url), capture_output=True, text=True, timeout=120)
        codes.append(proc.returncode)
    assert codes == [3, 3, contract.EXIT_RETRY], proc.stdout + proc.stderr  # a failure of kind io: 75
    rd = RunDir(url)
    assert rd.done_ids() == {0, 2} and rd.failed_ids() == {1}
    failure = rd.read_json("failed/000001.json")
    assert failure["kind"] == "io" and failure["error"].startswith("its worker process died"), failure
    assert "in-000001.tar" in failure["error"] and "2 times (io_retries=1)" in failure["error"], failure
    assert "task 1: failed [io] its worker process died" in proc.stdout
    assert "task 2: done" in proc.stdout or "task 2: skipped" in proc.stdout
    assert output_keys(out) == input_keys(3, 4, skip={1})  # tasks 0 and 2: every sample once
    assert temp_files(out) == [] and not (out / "in-000001.tar").exists()
    assert rd.list_names(RUNNING) == []  # status shows none of the dead attempts running
    assert died_records(rd) == [1, 1]
    # a later pod of the run (the orchestrator retries exit 75) keeps it failed without running it
    proc = subprocess.run(worker_cmd(url), capture_output=True, text=True, timeout=120)
    assert proc.returncode == contract.EXIT_RETRY and rd.failed_ids() == {1}, proc.stdout + proc.stderr


def test_a_dead_attempt_of_another_pod_runs_last_and_is_counted_once(tmp_path):
    url, out = planned(tmp_path, io_retries=1)
    rd = RunDir(url)
    entry = mark_running(rd, 0, time.time() - 1000, OTHER_POD, 30.0)  # its beats stopped long ago
    code, log = run_in_process(url)
    assert code == contract.EXIT_OK, log
    order = [log.index(f"task {t}: done") for t in range(3)]
    assert order[1] < order[2] < order[0], log  # the task that killed a pod ran after the others
    assert rd.list_names(RUNNING) == [] and died_records(rd) == [0]
    assert output_keys(out) == input_keys(3, 4)
    assert entry.rsplit("/", 1)[-1] not in rd.list_names(RUNNING)


def test_dead_attempts_over_io_retries_fail_the_task_without_running_it(tmp_path):
    url, out = planned(tmp_path, io_retries=0)
    rd = RunDir(url)
    mark_running(rd, 1, time.time() - 1000, OTHER_POD, 30.0)
    code, log = run_in_process(url)
    assert code == contract.EXIT_RETRY, log
    assert rd.done_ids() == {0, 2} and rd.failed_ids() == {1}
    error = rd.read_json("failed/000001.json")["error"]
    assert "in-000001.tar" in error and "1 time (io_retries=0)" in error, error
    assert output_keys(out) == input_keys(3, 4, skip={1}) and rd.list_names(RUNNING) == []


@pytest.mark.slow  # a second worker process, and one beat window watched (~1.3 s at 0.2 s beats)
def test_a_duplicate_pods_live_attempt_is_not_a_dead_one(tmp_path, monkeypatch):
    flag = tmp_path / "hold"
    flag.write_text("held")
    url, out = planned(tmp_path, io_retries=0, hold=str(flag))
    monkeypatch.setenv("SHARDFLOW_HEARTBEAT", "0.2")
    env = {**os.environ, "HOLD": "1", "SHARDFLOW_WORKER_HOST": "other-pod"}
    other = subprocess.Popen([*shardflow_command(), "worker", "--run-dir", url, "--index", "1"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rd = RunDir(url)
        deadline = time.monotonic() + 60
        while not rd.list_names(RUNNING) and time.monotonic() < deadline:  # task 1 started over there
            time.sleep(0.05)
        live = rd.list_names(RUNNING)
        assert [name.split(".")[0] for name in live] == ["000001"]
        code, log = run_in_process(url)  # io_retries=0: had it counted the live attempt, task 1 failed
        assert code == contract.EXIT_OK, log
        assert rd.done_ids() == {0, 1, 2} and rd.failed_ids() == set() and died_records(rd) == []
        assert live[0] in rd.list_names(RUNNING)  # the other pod's entry is its own to remove
    finally:
        flag.unlink()
        stdout, stderr = other.communicate(timeout=60)
    assert other.returncode == 0, stdout + stderr
    assert rd.list_names(RUNNING) == [] and temp_files(out) == []
    assert output_keys(out) == input_keys(3, 4)
