"""Per-worker setup (task/worker_fn.py): a callable class or a job file's setup() is made once per worker
process, on processes, Dask and the pod runner; a failing setup fails fast with one line.

Each construction leaves a file named after its pid in a folder: counting them is counting setups.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.job.jobfile import load_job, load_job_file
from shardflow.shards.samples import read_samples
from tests.support.jobs import make_shards, spec, tars, write_job
from tests.support.k8s import shardflow_command

JOB_FILE = """
    import os
    import uuid

    PARAMS = {"count_dir": "", "fail": False}

    def _mark(directory):
        with open(os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex}"), "w"):
            pass

    def setup():
        _mark(PARAMS["count_dir"])
        if PARAMS["fail"]:
            raise RuntimeError("no checkpoint at /models/x.pt")
        return {"pid": os.getpid()}

    def process(sample, state):
        return {"__key__": sample["__key__"], "json": {"pid": state["pid"]}}

    class Embedder:
        def __init__(self, count_dir, scale=1):
            _mark(count_dir)
            self.scale = scale

        def __call__(self, batch):
            return [{"__key__": s["__key__"], "json": {"pid": os.getpid(), "scale": self.scale}} for s in batch]
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 6, 3)
    return directory


def _setups(directory: Path) -> Counter:
    return Counter(p.name.split("-")[0] for p in directory.iterdir())


def _jsons(out: Path) -> list[dict]:
    return [json.loads(s["json"]) for p in tars(out) for s in read_samples(str(p))]


def _pids(out: Path) -> Counter:
    return Counter(meta["pid"] for meta in _jsons(out))


def _file_job(tmp_path, shards, **overrides):
    count = tmp_path / "count"
    count.mkdir()
    path = write_job(tmp_path, JOB_FILE)
    job = load_job(path, inputs=spec(shards, "in", 6), outputs=str(tmp_path / "out" / "{name}.tar"),
                   overrides={"count_dir": str(count), **overrides})
    return job, count


def test_setup_runs_once_per_process_worker(shards, tmp_path):
    job, count = _file_job(tmp_path, shards)
    report = job.run("processes", workers=2, progress=False)
    assert report.ok and report.stats.samples_out == 18
    setups = _setups(count)
    assert set(setups.values()) == {1} and 1 <= len(setups) <= 2  # one setup per worker, six tasks
    assert set(map(str, _pids(tmp_path / "out"))) <= set(setups)  # process got setup()'s state


def test_callable_class_is_constructed_once_per_worker(shards, tmp_path):
    module = load_job_file(write_job(tmp_path, JOB_FILE, "classes.py")).module
    count = tmp_path / "count"
    count.mkdir()
    job = sf.ShardJob(module.Embedder, spec(shards, "in", 6), str(tmp_path / "out" / "{name}.tar"),
                      fn_args=(str(count),), fn_kwargs={"scale": 3}, batch_size=2)
    assert job.name == "Embedder" and job.describe()["fn"].endswith(".Embedder")
    report = job.run("processes", workers=2, progress=False)
    assert report.ok and report.stats.samples_out == 18
    assert set(_setups(count).values()) == {1}
    scales = {meta["scale"] for meta in _jsons(tmp_path / "out")}
    assert scales == {3}
    assert job.run("serial", progress=False).ok  # a rerun has nothing to do: no construction either
    assert len(_setups(count)) <= 2
    with pytest.raises(JobError, match="fn_args / fn_kwargs are for a class"):
        sf.ShardJob(len, "a.tar", "b.tar", fn_kwargs={"x": 1})


def test_failing_setup_fails_fast_with_one_line(shards, tmp_path):
    """Construction raises: the task fails with one line naming it, the run stops (no setup per task)."""
    job, count = _file_job(tmp_path, shards, fail=True)
    report = job.run("serial", progress=False)
    assert not report.ok and report.done == 0
    assert sum(_setups(count).values()) == 1  # the run stopped at the first task
    failed = json.loads((Path(job.run_dir) / "failed" / "000000.json").read_text())
    assert "setup() of job.py failed" in failed["error"] and "no checkpoint at /models/x.pt" in failed["error"]
    assert "\n" not in failed["error"] and failed["kind"] == "user"


def test_setup_runs_once_per_dask_worker(shards, tmp_path, dask_cluster, dask_client):
    job, count = _file_job(tmp_path, shards)
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok and report.stats.samples_out == 18
    setups = _setups(count)
    assert set(setups.values()) == {1} and len(setups) <= 2  # two Dask workers


def test_setup_runs_once_per_pod(shards, tmp_path):
    """`shardflow worker` as a pod runs it (index from the env): one setup for the index's three tasks."""
    job, count = _file_job(tmp_path, shards)
    job.prepare()
    env = {**os.environ, "JOB_COMPLETION_INDEX": "1"}
    proc = subprocess.run([*shardflow_command(), "worker", "--run-dir", job.run_dir, "--tasks-per-index", "3"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert list(_setups(count).values()) == [1] and len(tars(tmp_path / "out")) == 3


def test_a_failed_construction_is_remembered_per_process():
    """Later tasks on the worker get the same SetupError at once, without constructing again."""
    from shardflow.task.worker_fn import PerWorker, SetupError, worker_fn

    calls = []

    def broken():
        calls.append(1)
        raise OSError("GPU out of memory")

    made = PerWorker(broken, name="Broken")
    for _ in range(3):
        with pytest.raises(SetupError, match="setup of Broken failed .* OSError: GPU out of memory"):
            worker_fn("job-1", made)
    assert calls == [1]
    assert worker_fn("job-2", PerWorker(lambda: len)) is len  # another job: made afresh
