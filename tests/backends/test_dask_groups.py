"""Tiny tasks in groups on Dask (several shardflow tasks per Dask task, backends.groups): each task is
still run, recorded and reported exactly once, a failure in a group loses none of its neighbours, a
lost worker's group runs again, and the bytes are those of the processes backend. Real clusters."""

from __future__ import annotations

import os
import threading
import time

import pytest

pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install -e '.[dask]')")

import shardflow as sf  # noqa: E402
from shardflow.backends.dask import execute_dask, submit  # noqa: E402
from shardflow.backends.groups import GROUPS_PER_THREAD, GroupSizer  # noqa: E402
from shardflow.errors import JobError  # noqa: E402
from shardflow.job.progress import Progress  # noqa: E402
from shardflow.shards.samples import read_samples  # noqa: E402
from tests.backends.test_dask import (  # noqa: E402
    digests,
    done_markers,
    expected_keys,
    keys_in,
    make_shards,
    noisy,
    outputs,
    slow,
    temps,
    truncate,
)


@pytest.fixture
def group_sizes(monkeypatch):
    """The sizes of the groups the client submits, in order."""
    sizes: list[int] = []
    take = submit.DaskRun._take

    def spy(self, size):
        group = take(self, size)
        sizes.append(len(group))
        return group

    monkeypatch.setattr(submit.DaskRun, "_take", spy)
    return sizes


def test_group_sizes_follow_task_time_and_count():
    sizer = GroupSizer()
    assert sizer.size(10_000, 2) == 1  # nothing measured yet: one task per call
    sizer.measured(0.002)
    assert sizer.size(10_000, 2) == 125  # 0.25 s of 2 ms tasks
    assert sizer.size(40, 2) == 40 // (2 * GROUPS_PER_THREAD)  # few left: every thread still gets several calls
    assert sizer.size(3, 2) == 1
    for _ in range(50):
        sizer.measured(2.0)
    assert sizer.size(10_000, 2) == 1  # tasks of seconds never group
    assert GroupSizer(7).size(3, 64) == 7
    for bad in (0, -1, 2.5):
        with pytest.raises(JobError, match="tasks_per_call"):
            GroupSizer(bad)


def test_groups_record_every_task_once_with_the_same_bytes(dask_cluster, dask_client, tmp_path, group_sizes):
    spec = make_shards(tmp_path / "in", 23, per_shard=2)
    assert sf.ShardJob(noisy, spec, str(tmp_path / "p" / "{name}.tar")).run("processes", workers=2, progress=False).ok
    job = sf.ShardJob(noisy, spec, str(tmp_path / "d" / "{name}.tar"))
    job.prepare()
    results = list(execute_dask(job, job.plan(), Progress(23, 0, enabled=False), address=dask_cluster.address,
                                tasks_per_call=5))
    assert sorted(r.task_id for r in results) == list(range(23))  # each task once
    assert all(r.status == "done" and r.stats.samples_in == 2 for r in results)
    assert group_sizes == [5, 5, 5, 5, 3]
    assert done_markers(job) == set(range(23))
    assert digests(tmp_path / "d") == digests(tmp_path / "p")
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok and report.skipped == 23

    group_sizes.clear()  # automatic: one task per call until measured, then groups of the tiny ones
    job = sf.ShardJob(noisy, make_shards(tmp_path / "in2", 120, per_shard=1), str(tmp_path / "a" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok and report.done == 120 and report.processed == 120
    assert sum(group_sizes) == 120 and group_sizes[0] == 1 and max(group_sizes) > 1


def test_a_bad_shard_in_a_group_loses_none_of_its_neighbours(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 8)
    truncate(tmp_path / "in" / "in-000002.tar")
    job = sf.ShardJob(noisy, spec, str(tmp_path / "out" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False, tasks_per_call=4)
    assert set(report.failed) == {2} and report.failed[2]["kind"] == "input"
    assert report.done == 7 and done_markers(job) == set(range(8)) - {2}
    assert job.rundir().failed_ids() == {2}


def test_a_run_stopped_in_a_group_starts_none_of_its_later_tasks(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 8, per_shard=4)
    truncate(tmp_path / "in" / "in-000001.tar")
    job = sf.ShardJob(noisy, spec, str(tmp_path / "out" / "{name}.tar"), on_error="raise")
    report = job.run("dask", address=dask_cluster.address, progress=False, tasks_per_call=8)
    assert set(report.failed) == {1}
    time.sleep(1.0)
    assert done_markers(job) == {0}  # tasks 2..7 of the group were never started
    assert not temps(tmp_path / "out") and not any(dask_client.processing().values())


def test_a_group_whose_worker_is_killed_runs_again_each_task_once(dask_cluster, dask_client, tmp_path):
    shards = 9
    spec = make_shards(tmp_path / "in", shards, per_shard=8)
    out = tmp_path / "out"
    job = sf.ShardJob(slow, spec, str(out / "{name}.tar"))  # 0.4 s a task, 1.2 s a group
    pids = dask_client.run(os.getpid)
    killed: dict[str, object] = {}

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = {w: keys for w, keys in dask_client.processing().items() if keys}
            if busy and done_markers(job) and temps(out):  # a group has finished a task and runs the next
                address = sorted(busy)[0]
                proc = next(p for p in dask_cluster.worker_procs if p.pid == pids.get(address))
                killed.update(address=address)
                dask_cluster.kill_worker(proc)
                dask_cluster.start_worker(wait=False)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    job.prepare()
    results = list(execute_dask(job, job.plan(), Progress(shards, 0, enabled=False), address=dask_cluster.address,
                                tasks_per_call=3))
    thread.join(5)
    assert killed, "no worker was killed while its group ran"
    assert sorted(r.task_id for r in results) == list(range(shards))  # each reported once, none lost
    assert all(r.status == "done" and r.stats.samples_in == 8 for r in results)
    assert done_markers(job) == set(range(shards))
    assert keys_in(out) == expected_keys(shards, 8) and len(outputs(out)) == shards and not temps(out)


@pytest.mark.cluster
def test_a_task_that_kills_its_workers_is_retried_alone(tmp_path, monkeypatch):
    import dask

    spec = make_shards(tmp_path / "in", 6)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)

    def poison(sample):  # SIGKILLs whichever worker process runs shard 4
        if "in-000004" in sample["__url__"]:
            os.kill(os.getpid(), 9)
        return {"__key__": sample["__key__"], "txt": os.environ.get("MALLOC_TRIM_THRESHOLD_", "unset").encode()}

    job = sf.ShardJob(poison, spec, str(tmp_path / "out" / "{name}.tar"))
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        report = job.run("dask", workers=2, dashboard_address=":0", progress=False, tasks_per_call=3)
    assert set(report.failed) == {4}, str(report)
    assert report.failed[4]["kind"] == "io" and "died 2 times" in report.failed[4]["error"]
    assert report.done == 5 and done_markers(job) == {0, 1, 2, 3, 5}  # its group's neighbours 3 and 5 too
    # the LocalCluster shardflow starts keeps glibc's dynamic mmap threshold, in its workers and here
    assert {s["txt"] for p in outputs(tmp_path / "out") for s in read_samples(str(p))} == {b"unset"}
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ
