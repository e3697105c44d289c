"""Every setting of a job reaches the function's worker identically, on every backend and in a pod.

The job's settings are one value (JobSpec); the bug this guards against: a job file with
`BATCH_SIZE = 4` ran batches of 4 on the driver and single samples in a pod (and `DEVICE` came back as
None there), because one of six hand-written lists of settings left them out. Here a job file sets
EVERY recordable field to a non-default value; its function reports `running_spec()` from inside the
worker into each output sample, and the test compares that with the driver's spec, field by field, for
serial, processes, Dask and a pod run from the manifest `shardflow k8s` generated. The same for a job
made in Python (with a class fn and its constructor arguments).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.job.jobfile import load_job
from shardflow.job.shard_job import ShardJob
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.task.spec import FUNCTION, RUNTIME, JobSpec, setting_default
from tests.support.k8s import run_indexed_job

# a non-default value for every field a job file may set; the check below makes a new field fail here
NON_DEFAULTS = {
    "decode": "l8", "encode": {"png_compress_level": 3}, "on_error": "warn", "seed": 7, "maxcount": 1000,
    "maxsize": 1e9, "inputs_per_task": 2, "storage_options": {"memory://nowhere/": {"auto_mkdir": True}},
    "max_failure_rate": 0.9, "io_retries": 1, "retry_backoff": 0.5, "retry_budget": 30.0, "allow_pickle": True,
    "allow_pipe": True, "name": "everyfield", "batch_size": 3, "collate": True, "device": "cpu",
    "params": {"x": 1}, "checksum": "blake3",
}
LOCATIONS = ("inputs", "outputs", "run_dir")  # given on the command line / as arguments

JOB_FILE = '''"""reports the settings its worker sees."""
import dataclasses, json
from shardflow import running_spec

{settings}
PARAMS = {{"x": 1}}


def process(batch):
    spec = dataclasses.asdict(running_spec())
    keys = batch["__key__"]  # collate=True: a dict of columns
    return {{"__key__": keys, "json": [{{"spec": spec, "batch": len(keys)}} for _ in keys]}}
'''


def _job_file(folder: Path) -> Path:
    lines = [f"{name.upper()} = {value!r}" for name, value in NON_DEFAULTS.items() if name != "params"]
    path = folder / "everyfield.py"
    path.write_text(JOB_FILE.format(settings="\n".join(lines)))
    return path


def _shards(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(4):
        with TarWriter(str(folder / f"in-{s:06d}.tar")) as writer:
            for i in range(5):
                writer.write({"__key__": f"s{s}/k{i}", "txt": b"x"})
    return str(folder / "in-{000000..000003}.tar")


def _seen(out: Path) -> list[dict]:
    """What the function saw, from every output sample (one report per sample)."""
    seen = []
    for shard in sorted(out.glob("*.tar")):
        seen.extend(json.loads(s["json"]) for s in read_samples(str(shard)))
    assert seen, f"no outputs in {out}"
    return seen


def _expected(spec: JobSpec) -> dict:
    """The spec as the function must see it (JSON-normalised, as it travelled)."""
    return json.loads(json.dumps(dataclasses.asdict(spec), default=list))


def _check(seen: list[dict], spec: JobSpec, samples: int = 20) -> None:
    assert len(seen) == samples
    expected = _expected(spec)
    for report in seen:
        got = report["spec"]
        different = {k: (got.get(k), expected[k]) for k in expected if got.get(k) != expected[k]}
        assert not different, f"settings that did not reach the worker as set: {different}"
    assert max(r["batch"] for r in seen) == spec.batch_size  # batches of 3 (and a last one of 2) per shard


def test_every_recordable_field_has_a_non_default_value_here():
    fields = dataclasses.fields(JobSpec)
    recordable = {f.name for f in fields if f.metadata["role"] not in (RUNTIME, FUNCTION)} - set(LOCATIONS)
    assert recordable == set(NON_DEFAULTS), "give the new setting a non-default value in NON_DEFAULTS"
    for name, value in NON_DEFAULTS.items():
        assert value != setting_default(name), name


@pytest.fixture
def job_file_run(tmp_path):
    inputs = _shards(tmp_path / "in")
    path = _job_file(tmp_path)

    def make(backend_dir: str) -> ShardJob:
        out = tmp_path / backend_dir
        return load_job(str(path), inputs, f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"))

    return make


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_job_file_setting_reaches_the_worker_locally(job_file_run, tmp_path, backend):
    job = job_file_run(backend)
    assert job.spec.batch_size == 3 and job.spec.device == "cpu"
    report = job.run(backend, progress=False)
    assert report.ok, report
    _check(_seen(tmp_path / backend), job.spec)


@pytest.mark.cluster
def test_a_job_file_setting_reaches_a_dask_worker(job_file_run, tmp_path):
    pytest.importorskip("distributed")
    job = job_file_run("dask")
    report = job.run("dask", workers=1, dashboard_address=None, progress=False)
    assert report.ok, report
    _check(_seen(tmp_path / "dask"), job.spec)


def test_a_job_file_setting_reaches_a_ray_worker(job_file_run, tmp_path, ray_local):
    job = job_file_run("ray")  # ray_local: a run without an address uses this process's Ray
    report = job.run("ray", progress=False)
    assert report.ok, report
    _check(_seen(tmp_path / "ray"), job.spec)


def test_a_job_file_setting_reaches_a_pod_run_from_the_generated_manifest(tmp_path):
    inputs = _shards(tmp_path / "in")
    path = _job_file(tmp_path)
    out = tmp_path / "pod"
    result = CliRunner().invoke(main, [
        "k8s", str(path), "--inputs", inputs, "--outputs", f"{out}/{{task:03d}}.tar", "--run-dir", str(out / "_run"),
        "--image", "shardflow:test", "--pvc", f"data:{tmp_path}",
    ])
    assert result.exit_code == 0, result.output
    run = run_indexed_job(yaml.safe_load(result.stdout), tmp_path / "pods")
    assert run.complete, run
    driver = load_job(str(path), inputs, f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"))
    _check(_seen(out), driver.spec)


class Reporter:
    """A class fn: constructed once per worker with fn_args / fn_kwargs."""

    def __init__(self, tag: str, *, scale: int) -> None:
        self.made = (tag, scale)

    def __call__(self, batch):
        from shardflow import running_spec

        spec = dataclasses.asdict(running_spec())
        keys = batch["__key__"]
        return {"__key__": keys, "json": [{"spec": spec, "batch": len(keys), "made": self.made} for _ in keys]}


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_python_job_setting_reaches_the_worker(tmp_path, backend):
    inputs = _shards(tmp_path / "in")
    out = tmp_path / backend
    settings = {k: v for k, v in NON_DEFAULTS.items()}
    job = ShardJob(Reporter, inputs, f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"),
                   fn_args=("a",), fn_kwargs={"scale": 2}, **settings)
    report = job.run(backend, progress=False)
    assert report.ok, report
    seen = _seen(out)
    _check(seen, job.spec)
    assert {tuple(r["made"]) for r in seen} == {("a", 2)}
