"""A process() that fails every sample of a task with the same exception is a bug: fatal for the run
(worker exit 78, backends stop after that task), not bad input retried or FailIndex'ed everywhere."""

from __future__ import annotations

import io

import pytest

from shardflow.cluster import contract, worker
from shardflow.job.shard_job import ShardJob
from tests.support.k8s import make_shards


def broken(sample):
    size = PARAMS["size"]  # noqa: F821 - the classic: a name the job file forgot to define
    return {"__key__": sample["__key__"], "txt": bytes(size)}


def odd_fails(sample):
    if int(sample["__key__"][-1]) % 2:
        raise ValueError(f"odd sample {sample['__key__']}")
    return {k: v for k, v in sample.items() if k != "__url__"}


def picky(sample):
    if sample["__key__"].endswith("0"):
        raise KeyError("first")
    raise ValueError("others")


def _job(tmp_path, fn, shards=3, per=12, **kw) -> ShardJob:
    make_shards(tmp_path / "in", shards, per)
    return ShardJob(fn, str(tmp_path / "in" / f"in-{{000000..{shards - 1:06d}}}.tar"), f"{tmp_path}/out/{{name}}.tar",
                    **kw)


def test_serial_run_stops_after_the_first_task_naming_the_bug(tmp_path):
    job = _job(tmp_path, broken)
    report = job.run("serial", progress=False)
    assert list(report.failed) == [0]  # stopped: tasks 1 and 2 never started
    failure = report.failed[0]
    assert failure["kind"] == "user"
    assert "same NameError on every sample (10 of 10)" in failure["error"]  # judged after 10, not 12
    assert "test_user_bug.py, line 16, in broken" in failure["error"]
    assert "name 'PARAMS' is not defined" in failure["error"] and "a bug in the job" in failure["error"]


def test_worker_exits_78_instead_of_failing_each_index(tmp_path):
    job = _job(tmp_path, broken, shards=2, per=3)
    job.prepare()
    out, err = io.StringIO(), io.StringIO()
    code = worker.run_chunk(job.run_dir, 0, 2, out=out, err=err)
    assert code == contract.EXIT_STOP == 78
    assert "task 1" not in out.getvalue()  # the chunk stopped at its first task
    assert "[user]" in out.getvalue() and "same NameError on every sample (3 of 3)" in out.getvalue()


@pytest.mark.parametrize("fn", [odd_fails, picky])
def test_some_samples_or_different_errors_stay_bad_input(tmp_path, fn):
    job = _job(tmp_path, fn, shards=2, per=24, max_failure_rate=0.1)
    report = job.run("serial", progress=False)
    assert set(report.failed) == {0, 1}  # the run went on: these are judged per task, as before
    assert {f["kind"] for f in report.failed.values()} == {"input"}


def test_dask_stops_after_the_first_such_task(dask_cluster, dask_client, tmp_path):
    job = _job(tmp_path, broken, shards=6, per=2)
    report = job.run("dask", address=dask_cluster.address, progress=False, max_in_flight=1)
    assert report.failed and {f["kind"] for f in report.failed.values()} == {"user"}
    assert len(report.failed) < 6 and report.done == 0
    assert "same NameError on every sample (2 of 2)" in next(iter(report.failed.values()))["error"]


def test_the_message_escapes_data_for_the_terminal():
    from shardflow.rundir.stats import Stats
    from shardflow.task.failures import user_bug

    stats = Stats()
    stats.samples_in = stats.failed = 1
    errors = [{"task": 0, "shard": "/d/\x1b[2Jevil.tar", "key": "k\x07", "stage": "process", "type": "ValueError",
               "reason": "ValueError: bad \x1b]0;title\x07", "traceback": "abc"}]
    message = user_bug(errors, stats)
    assert "\x1b" not in message and "\x07" not in message
    assert "\\x1b[2Jevil.tar" in message and "bad \\x1b]0;title\\x07" in message


@pytest.mark.slow
def test_processes_backend_stops_too(tmp_path):
    job = _job(tmp_path, broken, shards=8, per=2)
    report = job.run("processes", workers=2, progress=False)
    assert report.failed and {f["kind"] for f in report.failed.values()} == {"user"}
    assert len(report.failed) < 8 and report.done == 0  # stopped; the rest never started
