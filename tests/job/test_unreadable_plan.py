"""A plan.json (or plan chunk file) truncated by hand: the run stops with one line naming the file and
saying to use --redo, and --redo plans again over it (the shards the run directory's done markers name
are its own: no --overwrite needed) and succeeds, writing the same bytes."""

from __future__ import annotations

import hashlib

import pytest

from shardflow.errors import RunStateError
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.run_dir import RunDir
from tests.support.jobs import file_bytes, make_shards, tars


def passthrough(sample):
    return {"__key__": sample["__key__"], "json": sample["json"]}


def test_an_unreadable_plan_is_named_and_redo_plans_again(tmp_path):
    make_shards(tmp_path / "in", 3, 4)
    job = ShardJob(passthrough, str(tmp_path / "in" / "in-{000000..000002}.tar"), f"{tmp_path}/out/{{name}}.tar")
    assert job.run("serial", progress=False).ok
    first = file_bytes(tars(tmp_path / "out"))
    plan = tmp_path / "out" / "_shardflow" / "plan.json"
    plan.write_bytes(plan.read_bytes()[:120])  # truncated by hand
    with pytest.raises(RunStateError) as info:
        job.run("serial", progress=False)
    message = str(info.value)
    assert "\n" not in message and f"{plan} cannot be read" in message and "--redo" in message
    redone = job.run("serial", progress=False, redo=True)
    assert redone.ok and redone.done == 3 and redone.skipped == 0  # planned again, every task run again
    assert file_bytes(tars(tmp_path / "out")) == first
    assert job.run("serial", progress=False).skipped == 3  # the new plan reads: a no-op resume


def test_redo_plans_again_over_an_unreadable_plan_chunk(tmp_path):
    names = [f"memory://in/{hashlib.sha256(str(i).encode()).hexdigest()[:10]}.tar" for i in range(2_500)]
    job = ShardJob(passthrough, names, "memory://out/{name}.tar", run_dir=str(tmp_path / "rd"))
    job.prepare(overwrite=True)
    chunk = tmp_path / "rd" / "plan" / "chunk-000001.json"
    chunk.write_bytes(b"[{")
    rd = RunDir(str(tmp_path / "rd"))
    with pytest.raises(RunStateError, match="chunk-000001.json cannot be read.*--redo"):
        list(rd.load_tasks(rd.load_plan(), range(1_500, 1_501)))
    job.prepare(redo=True, overwrite=True)  # the stored plan equals the new one, but a chunk is unreadable
    assert list(rd.load_tasks(rd.load_plan(), range(1_500, 1_501))) == job.plan()[1_500:1_501]
