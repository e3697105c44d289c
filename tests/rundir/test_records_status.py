"""Task records (names that hold each task's times, counts and worker) and the status read from them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.job.shard_job import ShardJob
from shardflow.rundir.layout import RECORDS, RUNNING, done_file
from shardflow.rundir.records import DONE, FAILED, TaskRecord, latest, parse_record, parse_running, worker_name
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.status import read_status
from tests.support.jobs import cli, make_shards, spec

counts = st.integers(min_value=0, max_value=10**12)


@settings(max_examples=200, deadline=None)
@given(task=st.integers(0, 10**6), attempts=st.integers(1, 99), start=st.floats(0, 4e9), ms=st.integers(0, 10**9),
       cpu=st.integers(0, 10**9), numbers=st.lists(counts, min_size=9, max_size=9), worker=st.text(max_size=300),
       failed=st.booleans(), kind=st.sampled_from(["input", "io", "user"]))
def test_a_record_survives_its_name_whatever_the_worker_is_called(task, attempts, start, ms, cpu, numbers, worker,
                                                                   failed, kind):
    stats = Stats(*numbers[:7], shards_in=numbers[7], shards_out=numbers[8])
    record = TaskRecord(task, FAILED if failed else DONE, attempts, round(start, 3), ms / 1000, cpu / 1000, worker,
                        stats=None if failed else stats, kind=kind if failed else None)
    name = record.name()
    assert "/" not in name and not name.startswith(".") and len(name.encode()) <= 255  # one file name anywhere
    back = parse_record(name)
    assert back is not None and (back.task, back.state, back.attempts, back.kind) == \
        (task, record.state, attempts, record.kind)
    assert abs(back.start - record.start) < 1e-3 and back.seconds == ms / 1000 and back.cpu == cpu / 1000
    if not failed:
        assert back.stats is not None and [getattr(back.stats, f) for f in ("samples_in", "bytes_out", "shards_out")] \
            == [stats.samples_in, stats.bytes_out, stats.shards_out]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_other_name_in_records_is_ignored_not_an_error(name):
    record = parse_record(name)
    assert record is None or record.name().split(".")[:2] == name.split(".")[:2]
    parse_running(name)


def test_the_latest_record_of_a_task_wins_and_counts_its_runs():
    failed = TaskRecord(3, FAILED, 1, 100.0, 1.0, 0.5, "a~p1", kind="input")
    done = TaskRecord(3, DONE, 2, 200.0, 1.0, 0.5, "b~p2", stats=Stats(samples_in=5))
    other = TaskRecord(4, DONE, 1, 150.0, 1.0, 0.5, "a~p1", stats=Stats(samples_in=7))
    names = sorted(r.name() for r in (done, failed, other))
    last = list(latest(map(parse_record, names)))
    assert [(r.task, r.state, r.runs, r.retried) for r in last] == [(3, DONE, 2, True), (4, DONE, 1, False)]


def test_worker_names_say_host_slurm_array_task_and_pid():
    name = worker_name({"SHARDFLOW_WORKER_HOST": "node07.cluster.local", "SLURM_ARRAY_JOB_ID": "812",
                        "SLURM_ARRAY_TASK_ID": "5"}, pid=42)
    assert name == "node07~slurm812_5~p42"
    assert worker_name({"SHARDFLOW_WORKER_HOST": "job-7-x2z", "JOB_COMPLETION_INDEX": "7"}, pid=1) == \
        "job-7-x2z~index7~p1"


SLOW_JOB = """
import time

def process(sample):
    time.sleep(0.4)
    return sample
"""


def _slow_job(tmp: Path) -> ShardJob:
    import importlib.util

    (tmp / "slow_job.py").write_text(SLOW_JOB)
    module_spec = importlib.util.spec_from_file_location("slow_job_records", tmp / "slow_job.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return ShardJob(module.process, spec(tmp / "in", "in", 3), str(tmp / "out" / "{name}.tar"))


def test_status_during_a_run_names_the_running_task_its_worker_and_age_then_the_rate(tmp_path):
    make_shards(tmp_path / "in", 3, 4)
    job = _slow_job(tmp_path)
    thread = threading.Thread(target=lambda: job.run("serial", progress=False))
    thread.start()
    try:
        seen = None
        deadline = time.monotonic() + 60
        while seen is None and time.monotonic() < deadline:
            if (Path(job.run_dir) / "plan.json").exists():
                status = read_status(job.run_dir)
                if status.tally is not None and status.tally.running and status.done:
                    seen = status
            time.sleep(0.1)
    finally:
        thread.join(120)
    assert seen is not None, "no status showed a running task after a done one"
    running = seen.tally.running[0]
    assert running.worker == worker_name() and running.task not in seen.done
    text = str(seen)
    assert f"running task {running.task} on {worker_name()} for " in text and "1 running" in text
    assert "samples/s" in text and seen.tally.rate()[1] > 0
    final = read_status(job.run_dir)
    assert final.complete and final.tally.running == [] and not list((Path(job.run_dir) / RUNNING).iterdir())
    assert len(list((Path(job.run_dir) / RECORDS).iterdir())) == 3


def test_a_record_whose_marker_never_came_is_not_counted_done(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    job = ShardJob(lambda s: s, spec(tmp_path / "in", "in", 2), str(tmp_path / "out" / "{name}.tar"))
    assert job.run("serial", progress=False).ok
    rd = RunDir(job.run_dir)
    rd.remove(done_file(1))  # the worker died between the record and the marker
    rd.remove("summary.json")
    for name in rd.list_names("summaries"):
        rd.remove(f"summaries/{name}")
    status = read_status(job.run_dir)
    assert status.done == [0] and status.pending == [1] and status.stats.samples_in == 3


def test_status_exits_1_on_a_failed_task_and_watch_prints_it_once(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    (tmp_path / "in" / "in-000001.tar").write_bytes(b"not a tar" * 200)
    job = ShardJob(lambda s: s, spec(tmp_path / "in", "in", 2), str(tmp_path / "out" / "{name}.tar"))
    assert sorted(job.run("serial", progress=False).failed) == [1]
    status = cli("status", job.run_dir)
    assert status.returncode == 1 and "1 failed" in status.stdout
    watch = cli("status", job.run_dir, "--watch", "--interval", "0.1")
    assert watch.returncode == 1
    lines = watch.stdout.splitlines()
    assert "1/2 tasks done, 1 failed, 0 pending" in lines[0]
    assert sum(line.startswith("FAILED task 1 [input]") for line in lines) == 1
    complete = ShardJob(lambda s: s, spec(tmp_path / "in", "in", 1), str(tmp_path / "ok" / "{name}.tar"))
    assert complete.run("serial", progress=False).ok
    assert cli("status", complete.run_dir, "--check").returncode == 0
