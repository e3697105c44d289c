"""Tiny tasks in groups on the processes backend's pool (several tasks per pool call, backends.groups):
each task is still run, recorded and reported exactly once, the live sample counts add up, and a
worker killed in the middle of a group loses none of the group's finished tasks, and the run goes on
without it (a fresh pool). Real worker processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import shardflow as sf
from shardflow.backends import local
from shardflow.job.progress import Progress
from shardflow.rundir.layout import RECORDS, RUNNING, task_name
from tests.support.jobs import keys_in, make_shards, spec, tars, temp_files


def _copy(sample):
    return {"__key__": sample["__key__"], "jpg": sample["jpg"]}


@pytest.fixture
def groups(monkeypatch) -> list[list[int]]:
    """The task ids of each call the driver submits to the pool, in order (a spy on take_group)."""
    taken: list[list[int]] = []
    take = local.take_group

    def spy(remaining, size, alone):
        group = take(remaining, size, alone)
        taken.append([task.id for task in group])
        return group

    monkeypatch.setattr(local, "take_group", spy)
    return taken


def _job(tmp_path: Path, fn, shards: int, **settings) -> sf.ShardJob:
    make_shards(tmp_path / "in", shards, 1)
    return sf.ShardJob(fn, spec(tmp_path / "in", "in", shards), str(tmp_path / "out" / "{name}.tar"), **settings)


def test_tiny_tasks_go_to_the_pool_in_groups_and_each_is_recorded_once(tmp_path, groups):
    shards = 150
    job = _job(tmp_path, _copy, shards)
    job.prepare()
    bar = Progress(shards, 0, enabled=False)
    results = list(local.execute_processes(job, job.plan(), bar, workers=2))
    assert sorted(r.task_id for r in results) == list(range(shards))  # each task reported once
    assert all(r.status == "done" and r.stats.samples_in == 1 for r in results)
    assert sorted(t for group in groups for t in group) == list(range(shards))  # each submitted once
    assert len(groups[0]) == 1 and max(len(g) for g in groups) > 1  # one per call until measured, then groups
    assert bar.samples == shards  # the counts a worker holds back are sent at the end of each call
    assert job.rundir().done_ids() == set(range(shards))
    assert set(keys_in(tars(tmp_path / "out")).values()) == {1} and not temp_files(tmp_path / "out")


def _dies_in_a_group(victim_file: str, died_file: str):
    """A copy that SIGKILLs its worker process at the task named in `victim_file` (once)."""

    def fn(sample):
        task = int(sample["__url__"].rsplit("-", 1)[-1].split(".")[0])
        if not os.path.exists(died_file) and os.path.exists(victim_file):
            with open(victim_file) as f:
                victim = int(f.read())
            if task == victim:
                open(died_file, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}

    return fn


def test_a_worker_killed_in_a_group_loses_none_of_its_finished_tasks(tmp_path, monkeypatch):
    shards = 160
    victim, died = str(tmp_path / "victim"), str(tmp_path / "died")
    chosen: list[list[int]] = []
    taken: list[list[int]] = []
    take = local.take_group

    def choose(remaining, size, alone):  # the second task of the first group of several, past the start
        group = take(remaining, size, alone)
        taken.append([task.id for task in group])
        if not chosen and len(group) > 2 and group[0].id >= 20:
            chosen.append([task.id for task in group])
            with open(victim + ".tmp", "w") as f:  # whole or absent: a worker reads it meanwhile
                f.write(str(group[1].id))  # before the call is submitted: its worker reads it
            os.replace(victim + ".tmp", victim)
        return group

    monkeypatch.setattr(local, "take_group", choose)
    job = _job(tmp_path, _dies_in_a_group(victim, died), shards)
    report = job.run("processes", workers=2, progress=False)
    assert chosen and os.path.exists(died), f"no group of several tasks ran: chosen {chosen}, failed {report.failed}"
    first, killed = chosen[0][0], chosen[0][1]
    # the worker died once: a fresh pool ran the killed task again (alone) and the rest, in this same run
    assert report.ok and report.done == shards, report.failed
    assert [killed] in taken[taken.index(chosen[0]) + 1:]
    records = job.rundir().list_names(RECORDS)
    assert sum(name.startswith(task_name(first) + ".") for name in records) == 1  # finished before: not run again
    assert not job.rundir().list_names(RUNNING)  # the dead attempts' running entries went with them
    counts = keys_in(tars(tmp_path / "out"))
    assert len(counts) == shards and set(counts.values()) == {1} and not temp_files(tmp_path / "out")
