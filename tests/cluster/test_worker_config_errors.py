"""What retrying cannot fix stops a pod with exit 78 (stop every index), not 75 (Kubernetes would retry
the pod over and over):
- a job that refuses the `pipe:` inputs of its plan (the plan written by a job that allowed them, the
  job now stored without): one attempt, no I/O retries;
- an unreadable plan.json or plan chunk file, named in the line."""

from __future__ import annotations

import hashlib
import io
import json
import time

from shardflow.cluster import contract, worker
from shardflow.job.jobrecord import save_job
from shardflow.job.shard_job import ShardJob
from tests.support.jobs import make_shards


def passthrough(sample):
    return {"__key__": sample["__key__"], "json": sample["json"]}


def test_worker_exits_78_once_on_a_refused_pipe(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDFLOW_ALLOW_PIPE", raising=False)
    shards = make_shards(tmp_path / "in", 2, 3)
    job = ShardJob(passthrough, [f"pipe:cat {s}" for s in shards], [f"{tmp_path}/out/{i}.tar" for i in range(2)],
                   allow_pipe=True)
    run_dir = job.prepare()
    save_job(run_dir, job.replace(allow_pipe=False))  # what the pods load: pipes not allowed
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = worker.run_chunk(job.run_dir, 0, 2, out=out, err=err)
    assert code == contract.EXIT_STOP == 78
    assert time.monotonic() - started < 5  # no retries with backoff (~7.4 s before)
    lines = out.getvalue()
    assert "task 1" not in lines  # the chunk stopped at its first task: the same refusal everywhere
    assert "[user]" in lines and "allow_pipe=True" in lines and "I/O error" not in lines
    failed = json.loads((tmp_path / "out" / "_shardflow" / "failed" / "000000.json").read_text())
    assert failed["kind"] == "user"


def _prepared(tmp_path, inputs):
    job = ShardJob(passthrough, inputs, [f"{tmp_path}/out/{i}.tar" for i in range(len(inputs))])
    job.prepare()
    return job


def test_worker_exits_78_naming_an_unreadable_plan(tmp_path):
    job = _prepared(tmp_path, make_shards(tmp_path / "in", 2, 2))
    plan = tmp_path / "out" / "_shardflow" / "plan.json"
    plan.write_bytes(plan.read_bytes()[:80])
    out, err = io.StringIO(), io.StringIO()
    assert worker.run_chunk(job.run_dir, 0, 1, out=out, err=err) == contract.EXIT_STOP
    line = err.getvalue().strip()
    assert "\n" not in line and f"{plan} cannot be read" in line and "--redo" in line


def test_worker_exits_78_naming_an_unreadable_plan_chunk(tmp_path):
    # names that follow no numbering, too many for plan.json's table: the tasks go to chunk files
    names = [f"memory://in/{hashlib.sha256(str(i).encode()).hexdigest()[:10]}.tar" for i in range(2_500)]
    job = ShardJob(passthrough, names, "memory://out/{name}.tar", run_dir=str(tmp_path / "rd"))
    job.prepare(overwrite=True)
    chunk = tmp_path / "rd" / "plan" / "chunk-000000.json"
    chunk.write_bytes(chunk.read_bytes()[:20])
    out, err = io.StringIO(), io.StringIO()
    assert worker.run_chunk(job.run_dir, 0, 1, out=out, err=err) == contract.EXIT_STOP
    assert f"{chunk} cannot be read" in err.getvalue() and "--redo" in err.getvalue()
