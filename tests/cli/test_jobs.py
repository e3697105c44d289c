"""`shardflow run / plan / status / jobs / demo` as a user runs them: real subprocesses, real files."""

from __future__ import annotations

import json

import pytest

from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, make_shards, spec, tars, write_job

COPY_JOB = """
    '''Copies jpg and json; fails on request.'''
    PARAMS = dict(fail_on=None)

    def process(sample):
        if sample["__key__"] == PARAMS["fail_on"]:
            raise ValueError("asked to fail")
        return {"__key__": sample["__key__"], "jpg": sample["jpg"], "json": sample["json"]}
"""


@pytest.fixture()
def setup(tmp_path):
    make_shards(tmp_path / "in", 3, 4, bad={"s000005"})
    (tmp_path / "in" / "in-000002.tar").write_bytes(b"\0" * 100 + b"garbage" * 100)  # not a tar at all
    job = write_job(tmp_path, COPY_JOB, "copy.py")
    base = ["--inputs", spec(tmp_path / "in", "in", 3), "--outputs", str(tmp_path / "out" / "{name}.tar")]
    return tmp_path, job, base


def test_run_reports_failed_tasks_and_exits_1(setup):
    tmp_path, job, base = setup
    done = cli("run", job, *base, "--set", "fail_on=s000001", "--set", "decode=rgb8", "-b", "serial")
    assert done.returncode == 1, done.stderr
    assert "2/3 tasks done" in done.stdout and "1 failed" in done.stdout
    assert "FAILED task 2 [input]" in done.stdout and "in-000002.tar" in done.stdout
    assert "sample failures: " in done.stdout and "DecodeError (1)" in done.stdout and "ValueError (1)" in done.stdout
    assert "shardflow: 1 of 3 tasks failed (tasks 2); fix the cause and run the same command again" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in tars(tmp_path / "out")] == ["in-000000.tar", "in-000001.tar"]

    status = cli("status", tmp_path / "out" / "_shardflow")
    assert status.returncode == 1, status.stderr  # a failed task: a script can test it
    text = status.stdout
    assert "(job copy): has failed tasks" in text
    assert "tasks: 3 in the plan, 2 done, 1 failed, 0 pending" in text
    assert "samples (done tasks): 8 in, 6 out, 0 dropped, 0 skipped, 2 failed" in text
    assert "sample errors: 3 logged" in text and "decode DecodeError (1)" in text and "process ValueError (1)" in text
    assert "key 's000001' [process] ValueError: asked to fail" in text
    assert "FAILED task 2 [input]" in text

    as_json = json.loads(cli("status", tmp_path / "out" / "_shardflow", "--json").stdout)
    assert as_json["done"] == 2 and list(as_json["failed"]) == ["2"] and not as_json["complete"]
    assert as_json["stats"]["samples_out"] == 6


@pytest.mark.parametrize("args, words", [
    (["--set", "nope=1"], ["unknown setting 'nope'", "valid keys are job options: inputs, outputs, decode",
                           "PARAMS of copy.py: fail_on"]),
    (["--set", "maxcount"], ["--set 'maxcount' is not KEY=VALUE"]),
    (["--set", "on_error=ignore"], ["on_error must be one of"]),
])
def test_bad_settings_exit_2_with_one_line(setup, args, words):
    tmp_path, job, base = setup
    done = cli("run", job, *base, *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("shardflow: error: ")
    for word in words:
        assert word in done.stderr
    assert not (tmp_path / "out").exists()


def test_job_file_with_a_syntax_error(tmp_path):
    job = write_job(tmp_path, "PARAMS = dict(a=1\n\ndef process(sample):\n    return sample\n", "broken.py")
    done = cli("run", job, "--inputs", "x.tar", "--outputs", "y.tar")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert f"shardflow: error: job file {job}, line 1: SyntaxError: '(' was never closed" in done.stderr


@pytest.mark.slow
def test_start_up_mistakes(setup):
    tmp_path, job, base = setup
    mismatch = cli("run", job, "--inputs", spec(tmp_path / "in", "in", 3), "--outputs", str(tmp_path / "o-{0..1}.tar"))
    assert mismatch.returncode == 2
    assert "outputs name 2 shards but the inputs make 3 tasks" in mismatch.stderr
    no_inputs = cli("run", job, "--outputs", "y.tar")
    assert no_inputs.returncode == 2 and "no inputs given (pass --inputs SPEC)" in no_inputs.stderr
    nothing = cli("run", job, "--inputs", str(tmp_path / "nothing-*.tar"), "--outputs", "y/{name}.tar")
    assert nothing.returncode == 2 and "matched no shards" in nothing.stderr
    no_job = cli("run", tmp_path / "nojob.py", *base)
    assert no_job.returncode == 2 and "does not exist and is not a built-in job" in no_job.stderr
    address = cli("run", job, *base, "--address", "tcp://x:1")
    assert address.returncode == 2 and "--address is for --backend dask" in address.stderr
    bad_backend = cli("run", job, *base, "--backend", "lsf")
    assert bad_backend.returncode == 2 and "'lsf' is not one of" in bad_backend.stderr
    status = cli("status", tmp_path / "nowhere")
    assert status.returncode == 2 and "no plan.json in run directory" in status.stderr


def test_plan_shows_tasks_and_writes_nothing(setup):
    tmp_path, job, base = setup
    plan = cli("plan", job, *base, "--set", "maxcount=3")
    assert plan.returncode == 0, plan.stderr
    assert "job copy (" in plan.stdout and "Copies jpg and json" in plan.stdout
    assert "maxcount=3" in plan.stdout and "params: fail_on=null" in plan.stdout
    assert "3 tasks over 3 input shards" in plan.stdout
    assert f"task      1: {tmp_path / 'in' / 'in-000001.tar'} -> {tmp_path / 'out' / 'in-000001.tar'}" in plan.stdout
    assert "in-000000_001.tar" in plan.stdout  # how rollover parts are named
    assert not (tmp_path / "out").exists()

    assert cli("run", job, *base, "--set", "maxcount=3", "-b", "serial").returncode == 1
    again = json.loads(cli("plan", job, *base, "--set", "maxcount=3", "--json").stdout)
    assert again["run_dir_state"] == "same" and again["done"] == [0, 1] and len(again["tasks"]) == 3
    other = cli("plan", job, *base)
    assert "holds a DIFFERENT plan" in other.stdout


def test_jobs_lists_the_builtin_jobs():
    done = cli("jobs")
    assert done.returncode == 0
    for name in ("augment", "resize", "filter", "reshard"):
        assert f"\n{name}" in "\n" + done.stdout


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    done = cli("demo", "--dir", tmp_path / "demo", "--samples", "8", "--shards", "2", "--workers", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "wrote 2 shards x 4 samples (512x384 JPEG + json label)" in out
    assert "2/2 tasks done" in out and "8 in, 8 out" in out
    assert "png 512x384 RGB, cls 1" in out
    outputs = tars(tmp_path / "demo" / "augmented")
    assert len(outputs) == 2
    sample = next(iter(read_samples(str(outputs[0]))))
    assert sorted(k for k in sample if not k.startswith("__")) == ["cls", "png"]
    assert sample["png"].startswith(b"\x89PNG")
    # the command it prints resumes: nothing to redo
    command = next(line for line in out.splitlines() if line.startswith("run it again"))
    inputs = command.split("--inputs '")[1].split("'")[0]
    again = cli("run", "augment", "--inputs", inputs, "--outputs", str(tmp_path / "demo" / "augmented" / "{name}.tar"))
    assert again.returncode == 0, again.stderr
    assert "2/2 tasks done (2 already done before)" in again.stdout


def test_run_on_a_dask_cluster_by_address(setup, dask_cluster):
    """--backend dask --address: the job file reaches the cluster's workers by value (not importable there)."""
    tmp_path, job, base = setup
    done = cli("run", job, "--inputs", spec(tmp_path / "in", "in", 2),
               "--outputs", str(tmp_path / "out" / "{name}.tar"),
               "--backend", "dask", "--address", dask_cluster.address, "--set", "fail_on=s000002")
    assert done.returncode == 0, done.stderr
    assert "2/2 tasks done" in done.stdout and "8 in, 7 out" in done.stdout
    assert sorted(p.name for p in tars(tmp_path / "out")) == ["in-000000.tar", "in-000001.tar"]
