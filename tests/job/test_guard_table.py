"""The output guards on a plan given as a table (issue 11 safe outputs x issue 16 scale).

A brace range of inputs with an output pattern is planned as a table; the guards then decide from the
table's folders and make no Task when inputs and outputs are in different folders and the output
folder is empty, and still refuse a run in place or a folder holding someone else's shards.
"""

from __future__ import annotations

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.job import guard
from shardflow.job.lazy_plan import table_from_specs
from shardflow.rundir.plan_table import TaskTable
from tests.support.k8s import make_shards


def _copy(sample):
    return sample


def test_the_guards_of_a_table_plan_into_an_empty_folder_make_no_task(tmp_path, monkeypatch):
    make_shards(tmp_path / "in", 3, 2)
    inputs, outputs = str(tmp_path / "in" / "in-{000000..000002}.tar"), str(tmp_path / "out" / "{name}.tar")
    job = sf.ShardJob(_copy, inputs, outputs, run_dir=str(tmp_path / "rd"))
    table = table_from_specs(inputs, outputs, 1)
    assert table is not None
    made = []
    real_task = TaskTable.task
    monkeypatch.setattr(TaskTable, "task", lambda table, i: made.append(i) or real_task(table, i))  # counted
    guard.check_table(job, table, job.rundir())
    assert made == []  # decided from the table's folders (the plan's fingerprint streams tasks one by one)
    monkeypatch.undo()
    job.prepare()
    assert job._tasks is None
    assert job.run("serial", progress=False).ok


def test_a_table_plan_in_place_is_refused(tmp_path):
    make_shards(tmp_path / "in", 3, 2)
    job = sf.ShardJob(_copy, str(tmp_path / "in" / "in-{000000..000002}.tar"), str(tmp_path / "in" / "{name}.tar"),
                      run_dir=str(tmp_path / "rd"))
    with pytest.raises(JobError, match="is the input shard"):
        job.prepare()


def test_a_table_plan_over_a_foreign_shard_is_refused(tmp_path):
    make_shards(tmp_path / "in", 3, 2)
    make_shards(tmp_path / "out", 1, 2)  # out/in-000000.tar: a shard no run of this job wrote, under a planned name
    job = sf.ShardJob(_copy, str(tmp_path / "in" / "in-{000000..000002}.tar"), str(tmp_path / "out" / "{name}.tar"))
    with pytest.raises(JobError, match="output in-000000.tar in .* already exists"):
        job.prepare()
    assert job.prepare(overwrite=True) is not None
