"""A `pipe:` input or output without allow_pipe is a setting to change, found when the job is planned:
refused before any task runs (nothing retried, the command never started), one line saying how to
allow pipes; allowed, the same job runs."""

from __future__ import annotations

import time

import pytest

from shardflow.errors import PipeNotAllowed
from shardflow.job.shard_job import ShardJob
from tests.support.jobs import keys_in, make_shards, tars


def passthrough(sample):
    return {"__key__": sample["__key__"], "json": sample["json"]}


def test_a_refused_pipe_input_stops_the_job_at_plan_time(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDFLOW_ALLOW_PIPE", raising=False)
    (shard,) = make_shards(tmp_path / "in", 1, 4)
    ran = tmp_path / "ran"
    job = ShardJob(passthrough, [f"pipe:touch {ran}; cat {shard}"], [f"{tmp_path}/out/a.tar"])
    started = time.monotonic()
    with pytest.raises(PipeNotAllowed) as info:
        job.run("serial", progress=False)
    message = str(info.value)
    assert "\n" not in message and "allow_pipe=True" in message and "--set allow_pipe=true" in message
    assert not ran.exists(), "a refused pipe: must not run anything"
    assert not (tmp_path / "out" / "_shardflow" / "plan.json").exists()  # refused before the plan is written
    assert time.monotonic() - started < 5  # no I/O retries with backoff (4 of them took ~7.4 s)
    report = job.replace(allow_pipe=True).run("serial", progress=False)
    assert report.ok and ran.exists() and sum(keys_in(tars(tmp_path / "out")).values()) == 4


def test_a_refused_pipe_output_stops_the_job_at_plan_time(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDFLOW_ALLOW_PIPE", raising=False)
    (shard,) = make_shards(tmp_path / "in", 1, 2)
    ran = tmp_path / "ran"
    job = ShardJob(passthrough, [shard], [f"pipe:touch {ran}; cat > {tmp_path}/x.tar"], run_dir=str(tmp_path / "rd"))
    with pytest.raises(PipeNotAllowed, match="off by default"):
        job.run("serial", progress=False)
    assert not ran.exists()
