"""The sbatch script `shardflow slurm` prints (no Slurm needed): the flags a Slurm user expects as the
#SBATCH lines they would write, --setup and --container, threads, and the run-directory refusal."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.cluster.slurm.options import check_shared, mount_type
from shardflow.cluster.slurm.script import array_ranges
from shardflow.errors import JobError
from shardflow.job.jobfile import load_job
from tests.support.k8s import make_shards, write_job_file


@pytest.fixture
def render(tmp_path: Path):
    make_shards(tmp_path / "in", 5, 2)
    job = write_job_file(tmp_path)

    def run(*extra: str, ok: bool = True) -> tuple[str, str]:
        result = CliRunner().invoke(main, ["slurm", str(job), "-i", str(tmp_path / "in" / "in-{000000..000004}.tar"),
                                           "-o", f"{tmp_path}/out/{{name}}.tar", *extra])
        assert (result.exit_code == 0) == ok, result.output
        return result.stdout, result.stderr

    return run


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_flags_become_the_sbatch_lines_a_user_writes(render):
    script, err = render("--shared-fs", "--partition", "gpu", "--time", "4:00:00", "--cpus-per-task", "8",
                         "--mem", "32G", "--gpus", "1", "--account", "proj42", "--qos", "high", "--constraint", "a100",
                         "--exclude", "node[01-02]", "--sbatch-arg", "--reservation=datasets", "-p", "3",
                         "--tasks-per-array-task", "2", "--name", "aug", "--log-dir", "/shared/logs")
    lines = sbatch_lines(script)
    assert lines[:5] == ["--job-name=aug", "--array=0-2%3", "--nodes=1", "--ntasks=1", "--cpus-per-task=8"]
    for expected in ("--mem=32G", "--time=4:00:00", "--partition=gpu", "--account=proj42", "--qos=high",
                     "--constraint=a100", "--exclude=node[01-02]", "--gres=gpu:1", "--requeue",
                     "--signal=B:USR1@90", "--reservation=datasets", "--output=/shared/logs/%x-%A_%a.out"):
        assert expected in lines
    assert "5 tasks, 3 array tasks of 2 task(s); plan written to" in err
    # threads follow the CPUs Slurm gives the array task, unless the user set them
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-8}}"' in script
    assert '--tasks-per-index 2 --index "$SLURM_ARRAY_TASK_ID"' in script
    gpus = sbatch_lines(render("--shared-fs", "--gpus", "2", "--gpu-flag", "gpus-per-task")[0])
    assert "--gpus-per-task=2" in gpus and not any(line.startswith("--gres") for line in gpus)


def test_setup_and_container_lines_as_a_slurm_user_writes_them(render):
    script, _ = render("--shared-fs", "--setup", "module load cuda/12.4", "--setup", "source /shared/venv/bin/activate")
    body = script.splitlines()
    at = body.index("module load cuda/12.4")
    assert body[at + 1] == "source /shared/venv/bin/activate"
    assert body.index("set -uo pipefail") > at + 1  # module scripts often read unset variables: strict after them
    assert "SHARDFLOW=(shardflow)" in body
    script, _ = render("--shared-fs", "--container", "nvcr.io/nvidia/pytorch:24.05-py3", "--container-mount",
                       "/lustre:/lustre", "--command", "python -m shardflow")
    assert ("SHARDFLOW=(srun --ntasks=1 --container-image=nvcr.io/nvidia/pytorch:24.05-py3 "
            "--container-mounts=/lustre:/lustre python -m shardflow)") in script.splitlines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_is_valid_bash(render, tmp_path):
    script, _ = render("--shared-fs", "--setup", "echo ready", "--container", "img:1", "--env", "HF_HOME=/shared/hf")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "export HF_HOME=/shared/hf" in script


def test_local_run_dir_is_refused_without_shared_fs(render, tmp_path):
    _, err = render(ok=False)
    assert "on this machine's" in err and "--shared-fs" in err and "\n" not in err.strip()
    assert not (tmp_path / "out" / "_shardflow" / "plan.json").exists()  # refused before writing anything
    _, err = render("--env", "AWS_SECRET_ACCESS_KEY=x", "--shared-fs", ok=False)
    assert "looks like a secret" in err


def test_run_dir_checks(tmp_path):
    with pytest.raises(JobError, match="relative path"):
        check_shared("out/_shardflow", "run directory", shared_fs=True)
    check_shared("s3://bucket/run", "run directory", shared_fs=False)  # every node reaches an object store
    check_shared(str(tmp_path), "run directory", shared_fs=True)
    mounts = tmp_path / "mounts"
    mounts.write_text("overlay / overlay rw 0 0\nserver:/export /shared nfs4 rw 0 0\n")
    assert mount_type("/shared/runs/a", str(mounts)) == "nfs4"
    assert mount_type("/sharedx/a", str(mounts)) == "overlay"


def test_array_ranges():
    assert array_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert array_ranges([3]) == "3"
    assert array_ranges([]) == ""


def test_to_slurm_returns_the_script_and_writes_the_plan(tmp_path):
    make_shards(tmp_path / "in", 3, 2)
    job = load_job(str(write_job_file(tmp_path)), inputs=str(tmp_path / "in" / "in-{000000..000002}.tar"),
                   outputs=f"{tmp_path}/out/{{name}}.tar")
    script = job.to_slurm(shared_fs=True, partition="cpu", array_parallelism=2)
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --partition=cpu" in script
    assert (tmp_path / "out" / "_shardflow" / "plan.json").exists()


def test_example_in_slurm_folder_is_what_the_command_prints():
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "slurm" / "README.md").read_text()
    command = readme.split("```bash\n", 1)[1].split(" > slurm/", 1)[0].replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[:2] == ["shardflow", "slurm"]
    result = CliRunner().invoke(main, argv[1:])
    assert result.exit_code == 0, result.output
    assert result.stdout == (repo / "slurm" / "augment-s3-pyxis.sbatch").read_text()
