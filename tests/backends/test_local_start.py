"""The processes backend's start (backends/local.py): a run too small for a pool runs in the driver, and
the fork server preloads the heavy modules the job names, not every one the driver happened to import."""

from __future__ import annotations

import os

import cloudpickle
import pytest

import shardflow as sf
from shardflow.backends.forkserver import preload_for
from shardflow.shards.samples import read_samples
from tests.support.jobs import make_shards, spec, tars, write_job


def _stamp(sample):
    """Passthrough that notes the process it ran in."""
    return {**sample, "pid": str(os.getpid()).encode()}


def _stamp_decoded(sample):
    return {"__key__": sample["__key__"], "pid": str(os.getpid()).encode()}


def _pids(out):
    return {s["pid"].decode() for p in tars(out) for s in read_samples(str(p))}


@pytest.fixture
def pool_by_size(monkeypatch):
    monkeypatch.delenv("SHARDFLOW_ALWAYS_POOL", raising=False)  # tests/conftest.py sets it for the others


def _run(tmp_path, fn, shards, workers=None, **settings):
    inputs = make_shards(tmp_path / "in", shards, 3)
    job = sf.ShardJob(fn, spec(tmp_path / "in", "in", len(inputs)), str(tmp_path / "out" / "{name}.tar"),
                      run_dir=str(tmp_path / "run"), **settings)
    report = job.run("processes", workers=workers, progress=False)
    assert report.ok and report.stats.samples_out == 3 * shards
    return _pids(tmp_path / "out")


def test_a_small_raw_bytes_run_runs_in_the_driver(tmp_path, pool_by_size):
    assert _run(tmp_path, _stamp, 3) == {str(os.getpid())}


def test_a_run_given_a_worker_count_gets_its_workers(tmp_path, pool_by_size):
    pids = _run(tmp_path, _stamp, 3, workers=2)  # --workers 2: the user asked for processes
    assert str(os.getpid()) not in pids and pids


def test_one_task_runs_in_the_driver_even_when_it_decodes(tmp_path, pool_by_size):
    assert _run(tmp_path, _stamp_decoded, 1, decode="rgb8") == {str(os.getpid())}


def test_a_decoding_job_of_several_tasks_gets_its_workers(tmp_path, pool_by_size):
    pids = _run(tmp_path, _stamp_decoded, 2, decode="rgb8")
    assert str(os.getpid()) not in pids and pids


def test_always_pool_keeps_the_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_ALWAYS_POOL", "1")
    pids = _run(tmp_path, _stamp, 3)
    assert str(os.getpid()) not in pids and pids


def test_the_fork_server_preloads_what_the_job_names(tmp_path):
    pytest.importorskip("torch")  # imported by this driver for its own reasons
    plain = sf.ShardJob(_stamp, "a.tar", "b.tar")
    assert "torch" not in preload_for(cloudpickle.dumps(plain))
    assert "shardflow.task.run_task" in preload_for(cloudpickle.dumps(plain))
    assert "torch" in preload_for(cloudpickle.dumps(sf.ShardJob(_stamp, "a.tar", "b.tar", decode="torchrgb")))
    job_file = write_job(tmp_path, """
        import torch

        def process(sample):
            return {"__key__": sample["__key__"], "pt": torch.zeros(1)}
    """)
    assert "torch" in preload_for(cloudpickle.dumps(sf.load_job(job_file, "a.tar", "b.tar")))
