"""Writing the plan: one clear line without bucket credentials; `shardflow worker --prepare` in the cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.rundir.run_dir import RunDir
from tests.support.k8s import input_keys, make_shards, output_keys, shardflow_command, write_job_file


@pytest.mark.slow
def test_k8s_without_credentials_is_one_line(tmp_path):
    path = write_job_file(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ACCESS", "AWS_SECRET", "AWS_SESSION",
                                                                    "AWS_PROFILE"))}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")
    result = subprocess.run(
        [*shardflow_command(), "k8s", str(path), "--inputs", "s3://bkt/in-{000000..000003}.tar",
         "--outputs", "s3://bkt/out/{name}.tar", "--image", "i:1",
         "--storage-option", "client_kwargs.endpoint_url=http://127.0.0.1:9"],
        capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "NoCredentialsError" in lines[0]
    assert "s3://bkt/out/_shardflow" in lines[0] and "--no-prepare" in lines[0] and "worker --prepare" in lines[0]


def test_no_prepare_then_worker_prepare_in_the_cluster(tmp_path):
    make_shards(tmp_path / "in", 3, 2)
    path = write_job_file(tmp_path)
    run_dir = str(tmp_path / "run")
    spec = ["--inputs", str(tmp_path / "in" / "in-{000000..000002}.tar"), "--outputs", f"{tmp_path}/out/{{name}}.tar"]
    rendered = CliRunner().invoke(main, ["k8s", str(path), *spec, "--run-dir", run_dir, "--image", "i:1",
                                         "--no-prepare", "--pvc", f"data:{tmp_path}"])
    assert rendered.exit_code == 0, rendered.output
    assert yaml.safe_load(rendered.stdout)["spec"]["completions"] == 3 and not Path(run_dir).exists()
    # what the in-cluster step runs (it must see the job file: built in, in the image, or mounted)
    prepared = CliRunner().invoke(main, ["worker", "--run-dir", run_dir, "--prepare", str(path), *spec,
                                         "--set", "sleep=0"])
    assert prepared.exit_code == 0, prepared.output
    assert "3 tasks planned" in prepared.stdout
    again = CliRunner().invoke(main, ["worker", "--run-dir", run_dir, "--prepare", str(path), *spec,
                                      "--set", "sleep=0"])
    assert again.exit_code == 0, again.output  # idempotent: the same plan
    for index in range(3):
        ran = CliRunner().invoke(main, ["worker", "--run-dir", run_dir, "--index", str(index)])
        assert ran.exit_code == 0, ran.output
    assert RunDir(run_dir).done_ids() == {0, 1, 2}
    assert output_keys(tmp_path / "out") == input_keys(3, 2)


def test_worker_prepare_refuses_a_different_plan_or_a_broken_job(tmp_path):
    make_shards(tmp_path / "in", 2, 1)
    path = write_job_file(tmp_path)
    run_dir = str(tmp_path / "run")
    spec = ["--inputs", str(tmp_path / "in" / "in-{000000..000001}.tar"), "--outputs", f"{tmp_path}/out/{{name}}.tar"]
    assert CliRunner().invoke(main, ["worker", "--run-dir", run_dir, "--prepare", str(path), *spec]).exit_code == 0
    other = CliRunner().invoke(main, ["worker", "--run-dir", run_dir, "--prepare", str(path), *spec,
                                      "--set", "sleep=1"])
    assert other.exit_code == 78 and "different plan" in other.output
    broken = tmp_path / "broken.py"
    broken.write_text("def process(sample):\n    return sample\nraise RuntimeError('no')\n")
    bad = CliRunner().invoke(main, ["worker", "--run-dir", str(tmp_path / "r2"), "--prepare", str(broken), *spec])
    assert bad.exit_code == 78 and "broken.py, line 3" in bad.output
