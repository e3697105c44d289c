"""Dask workers in another working directory: relative paths made absolute, inputs checked on the
workers, an input a worker cannot see is an io failure; thread limits from the worker's thread count."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install -e '.[dask]')")

from shardflow.errors import JobError  # noqa: E402
from shardflow.job.shard_job import ShardJob  # noqa: E402
from shardflow.rundir.status import read_status  # noqa: E402
from tests.support.k8s import input_keys, make_shards, output_keys  # noqa: E402


def copy_sample(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def threads_seen(sample):
    return {"__key__": sample["__key__"], "txt": os.environ.get("OMP_NUM_THREADS", "unset").encode()}


def test_relative_paths_on_workers_in_another_directory(dask_cluster, dask_client, tmp_path, monkeypatch):
    assert Path(dask_cluster.workdir).resolve() != tmp_path.resolve()  # the workers' cwd (conftest)
    make_shards(tmp_path / "in", 4, 3)
    monkeypatch.chdir(tmp_path)
    job = ShardJob(copy_sample, "in/in-{000000..000003}.tar", "out/{name}.tar")  # relative, as typed
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok and report.done == 4, report
    assert output_keys(tmp_path / "out") == input_keys(4, 3)
    status = read_status("out/_shardflow")  # one run directory, the one the client planned
    assert len(status.done) == 4 and not status.pending and not status.failed
    assert not (Path(dask_cluster.workdir) / "out").exists()  # nothing written relative to the workers


def test_workers_blind_to_the_inputs_stop_the_run_before_any_task(dask_cluster, dask_client, tmp_path):
    # an object store the workers cannot reach (nothing listens on port 9): the preflight's one stat fails
    options = {"anon": True, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    job = ShardJob(copy_sample, "s3://unreachable/in-{000000..000009}.tar", f"{tmp_path}/out/{{name}}.tar",
                   storage_options=options, io_retries=0)
    started = time.monotonic()
    with pytest.raises(JobError) as exc:
        job.run("dask", address=dask_cluster.address, progress=False)
    assert "cannot see the inputs" in str(exc.value) and "s3://unreachable/in-000000.tar" in str(exc.value)
    assert job.rundir().failed_ids() == set()  # stopped before any task ran
    assert time.monotonic() - started < 60


def test_an_input_folder_this_machine_lacks_is_io_not_missing(tmp_path):
    make_shards(tmp_path / "in", 2, 1)
    make_shards(tmp_path / "mnt", 1, 1)
    inputs = [str(tmp_path / "in" / "in-000000.tar"), str(tmp_path / "in" / "in-000001.tar"),
              str(tmp_path / "mnt" / "in-000000.tar")]
    job = ShardJob(copy_sample, inputs, [f"{tmp_path}/out/{i}.tar" for i in range(3)], io_retries=0)
    job.prepare()
    (tmp_path / "in" / "in-000001.tar").unlink()  # missing from a folder this machine sees: restore it
    for path in (tmp_path / "mnt").iterdir():
        path.unlink()
    (tmp_path / "mnt").rmdir()  # the whole folder absent here: a worker without the mount
    report = job.run("serial", progress=False)
    assert {task: f["kind"] for task, f in report.failed.items()} == {1: "input", 2: "io"}
    assert "restore it" in report.failed[1]["error"] and "not visible on this machine" in report.failed[2]["error"]


def test_dask_worker_threads_follow_its_thread_count(dask_cluster, dask_client, tmp_path):
    make_shards(tmp_path / "in", 1, 1)
    job = ShardJob(threads_seen, str(tmp_path / "in" / "in-000000.tar"), f"{tmp_path}/out/{{name}}.tar")
    assert job.run("dask", address=dask_cluster.address, progress=False).ok
    from shardflow.shards.samples import read_samples

    (sample,) = read_samples(str(tmp_path / "out" / "in-000000.tar"))
    assert sample["txt"] == b"1"  # conftest's workers: OMP_NUM_THREADS=1 given; kept, not raised


@pytest.mark.slow
def test_limit_threads_sets_the_variables_and_torch(tmp_path):
    pytest.importorskip("torch")
    import subprocess
    import sys

    code = ("import torch, os; from shardflow.task.threads import limit_threads; "
            "print(limit_threads(3), torch.get_num_threads(), os.environ['MKL_NUM_THREADS'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["3", "3", "3"], out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_NUM_THREADS": "2"}, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["2", "2", "2"], out.stderr  # what the user (or the manifest) set wins


def test_one_probe_per_input_folder_or_bucket(tmp_path, monkeypatch):
    from shardflow.backends.paths import absolute, absolute_task, input_probes, probe
    from shardflow.rundir.tasks import Task

    monkeypatch.chdir(tmp_path)
    tasks = [Task(i, (f"a/in-{i}.tar", f"s3://bkt/x/in-{i}.tar", "-"), f"out/{i}.tar", f"out/{i}_{{part}}.tar")
             for i in range(3)]
    tasks.append(Task(3, ("/elsewhere/in-3.tar", "gs://other/in-3.tar"), "/o/3.tar", "/o/3_{part}.tar"))
    probes = input_probes([absolute_task(t) for t in tasks], lambda url: {"anon": True})
    assert probes == [("dir", str(tmp_path / "a"), None), ("object", "s3://bkt/x/in-0.tar", {"anon": True}),
                      ("dir", "/elsewhere", None), ("object", "gs://other/in-3.tar", {"anon": True})]
    assert absolute("pipe:cat x") == "pipe:cat x" and absolute("s3://b/k") == "s3://b/k"
    assert absolute("file:///abs/x.tar") == "file:///abs/x.tar"
    (tmp_path / "a").mkdir()
    assert probe("dir", str(tmp_path / "a"), None) is None
    assert "no directory /elsewhere on this worker" in probe("dir", "/elsewhere", None)
