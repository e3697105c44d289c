"""User mistakes found by an audit: each is one clear line with the right exit status, never a traceback
(the real `shardflow` command in a subprocess, as a user runs it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from shardflow.cluster.slurm.options import SlurmOptions
from shardflow.errors import JobError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.task.spec import JobSpec
from tests.cli.test_inspect import cli, one_line_error
from tests.support.k8s import make_shards, write_job_file


def shard(path: Path, samples: dict[str, dict[str, bytes]]) -> str:
    with TarWriter(str(path)) as writer:
        for key, members in samples.items():
            writer.write({"__key__": key, **members})
    return str(path)


def keys_of(path: Path) -> list[str]:
    with open(path, "rb") as f:
        return [s["__key__"] for s in read_samples(f, str(path))]


# -- 1. nothing the user types adds a line to the sbatch script ---------------------------------------
def test_a_newline_in_a_slurm_option_is_refused_not_written_as_another_sbatch_line(tmp_path):
    make_shards(tmp_path / "in", 2, 2)
    job = write_job_file(tmp_path)
    result = cli("slurm", job, "-i", tmp_path / "in" / "in-{000000..000001}.tar", "-o", f"{tmp_path}/out/{{name}}.tar",
                 "--shared-fs", "--partition", "cpu\n#SBATCH --wrap=evil")
    assert result.returncode == 2
    assert "--partition" in one_line_error(result.stderr)
    assert b"--wrap=evil" not in result.stdout


@pytest.mark.parametrize("field", ["name", "partition", "time", "mem", "account", "qos", "constraint", "exclude",
                                   "log_dir", "run_dir"])
def test_every_value_written_verbatim_into_the_script_must_be_one_line(field):
    with pytest.raises(JobError, match=f"--{field.replace('_', '-')} .*control character"):
        SlurmOptions(**{"run_dir": "/shared/run", "tasks": 1, field: "x\r#SBATCH --wrap=evil"})


@pytest.mark.parametrize("option", [{"sbatch_args": ["--reservation=a\x1b[2J"]}, {"setup": ["module load x\rrm"]},
                                    {"env": [("A\nB", "1")]}])
def test_list_options_and_env_names_must_be_one_line_too(option):
    with pytest.raises(JobError):
        SlurmOptions(run_dir="/shared/run", tasks=1, **option)


# -- 2. numbers: finite, in range, refused at the option or by JobSpec ---------------------------------
@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_sort_memory_must_be_a_finite_positive_number(tmp_path, value):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}})
    result = cli("sort", src, "-o", f"{tmp_path}/o/{{name}}.tar", "--memory", value)
    assert result.returncode == 2
    assert b"Traceback" not in result.stderr and b"'--memory'" in result.stderr


@pytest.mark.parametrize("command", [("split",), ("cat",), ("map", "-c", "true")])
@pytest.mark.parametrize("value", ["-5", "nan", "inf", "100"])
def test_maxsize_is_refused_in_one_line_before_the_job_starts(tmp_path, command, value):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}})
    out = f"{tmp_path}/o/all.tar" if command[0] == "cat" else f"{tmp_path}/o/{{name}}-{{part}}.tar"
    result = cli(*command, src, "-o", out, "--maxsize", value)
    assert result.returncode == 2
    assert "maxsize must be a number of bytes >= 1536" in one_line_error(result.stderr)
    assert not (tmp_path / "o").exists()  # no run directory: nothing started


def test_map_timeout_nan_is_a_usage_error(tmp_path):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}})
    result = cli("map", src, "-o", f"{tmp_path}/o/{{name}}.tar", "-c", "true", "--timeout", "nan")
    assert result.returncode == 2
    assert b"'--timeout'" in result.stderr and b"finite" in result.stderr


@pytest.mark.parametrize("args", [("--max-member-size", "nan"), ("--maxsize", "100")])
def test_create_refuses_bounds_that_switch_off_or_break_the_writer(tmp_path, args):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hi")
    result = cli("create", tmp_path / "src", "-o", tmp_path / "o.tar", *args)
    assert result.returncode == 2
    assert b"Traceback" not in result.stderr and args[0].encode() in result.stderr
    if args[1] == "100":
        assert b"1536" in result.stderr  # the minimum is said


@pytest.mark.parametrize("settings", [{"maxsize": math.nan}, {"maxsize": math.inf}, {"maxsize": 100},
                                      {"maxcount": -1}, {"maxcount": 2.5}, {"maxsize": "big"}])
def test_jobspec_refuses_bad_rollover_bounds_for_the_python_api_too(settings):
    with pytest.raises(JobError, match=next(iter(settings))):
        JobSpec(**settings)


def test_jobspec_keeps_zero_and_none_as_no_rollover():
    assert JobSpec(maxcount=0, maxsize=0).rollover == JobSpec().rollover


# -- 3. state files and run directories ---------------------------------------------------------------
@pytest.mark.parametrize("text", ["[1, 2]", "{}", '"plan"'])
@pytest.mark.parametrize("command", ["status", "report"])
def test_a_plan_json_that_is_not_a_plan_is_one_line_naming_the_file(tmp_path, text, command):
    run_dir = tmp_path / "f" / "_shardflow"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(text)
    result = cli(command, run_dir)
    line = one_line_error(result.stderr)
    assert result.returncode != 0 and "plan.json" in line and "not a plan" in line
    assert b"complete" not in result.stdout


@pytest.mark.parametrize("command", ["status", "report"])
def test_a_shard_given_as_run_directory_is_named_a_file(tmp_path, command):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}})
    result = cli(command, src)
    assert result.returncode != 0
    assert one_line_error(result.stderr).endswith("in.tar is a file, not a run directory")


def test_worker_on_a_file_is_a_permanent_failure_not_retried(tmp_path):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}})
    result = cli("worker", "--run-dir", src, "--index", "0")
    assert result.returncode == 78  # EXIT_STOP: not 75, which Kubernetes and Slurm retry
    assert b"is a file, not a run directory" in result.stderr and b"Traceback" not in result.stderr


def test_worker_without_a_plan_points_to_the_commands_that_write_one(tmp_path):
    result = cli("worker", "--run-dir", tmp_path / "empty", "--index", "0")
    assert result.returncode == 78
    assert b"shardflow worker --prepare" in result.stderr and b"`shardflow plan`" not in result.stderr


# -- 4. create -o ---------------------------------------------------------------------------------------
def test_create_output_with_a_field_it_does_not_fill_says_which_it_takes(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hi")
    result = cli("create", tmp_path / "src", "-o", tmp_path / "x-{task}.tar")
    line = one_line_error(result.stderr)
    assert result.returncode != 0 and "'task'" in line and "{part}" in line and "KeyError" not in line


# -- 5. sort: a bad field is one sample's error -------------------------------------------------------
def bad_json_shard(tmp_path: Path) -> str:
    return shard(tmp_path / "in.tar", {"a": {"json": b'{"x": 2}'}, "b": {"json": b"{bad"}, "c": {"json": b'{"x": 1}'}})


def test_sort_skip_drops_and_logs_the_sample_whose_field_is_unreadable(tmp_path):
    src = bad_json_shard(tmp_path)
    result = cli("sort", src, "-o", f"{tmp_path}/o/{{name}}.tar", "--by", "json.x", "--on-error", "skip")
    assert result.returncode == 0, result.stderr
    assert keys_of(tmp_path / "o" / "in.tar") == ["c", "a"]
    assert b"Traceback" not in result.stderr + result.stdout
    logged = [json.loads(line) for f in (tmp_path / "o" / "_shardflow" / "errors").iterdir()
              for line in f.read_text().splitlines()]
    assert [(e["key"], e["type"]) for e in logged] == [("b", "SortFieldError")]


def test_sort_raise_fails_the_task_naming_shard_and_key_without_a_traceback(tmp_path):
    src = bad_json_shard(tmp_path)
    result = cli("sort", src, "-o", f"{tmp_path}/o/{{name}}.tar", "--by", "json.x", "--on-error", "raise")
    assert result.returncode == 1
    out = (result.stdout + result.stderr).decode()
    assert "Traceback" not in out
    failed = next(line for line in out.splitlines() if line.startswith("FAILED task 0"))
    assert "in.tar" in failed and "key 'b'" in failed and "json.x" in failed


def test_sort_missing_tmpdir_is_a_usage_error_before_the_run(tmp_path):
    src = bad_json_shard(tmp_path)
    result = cli("sort", src, "-o", f"{tmp_path}/o/{{name}}.tar", "--tmpdir", tmp_path / "nonexist")
    assert result.returncode == 2 and b"'--tmpdir'" in result.stderr
    assert not (tmp_path / "o").exists()


# -- 6. exit codes ------------------------------------------------------------------------------------
def test_cat_ext_that_matches_nothing_is_an_error_like_a_missing_key(tmp_path):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}, "b": {"json": b"{}"}})
    result = cli("cat", src, "-e", "nope")
    assert result.returncode == 1 and "extension 'nope'" in one_line_error(result.stderr)
    found = cli("cat", src, "-e", "txt")  # one sample has it: the others are skipped quietly, as before
    assert found.returncode == 0 and found.stdout == b"1"


RAISES = '''
def process(sample):
    if PARAMS["fail"] == "all" or sample["__key__"] == PARAMS["fail"]:
        raise ValueError("broken")
    return sample
PARAMS = dict(fail="all")
'''


@pytest.mark.parametrize("fail, code", [("all", 1), ("a", 0)])
def test_preview_exits_1_only_when_every_previewed_sample_failed(tmp_path, fail, code):
    src = shard(tmp_path / "in.tar", {"a": {"txt": b"1"}, "b": {"txt": b"2"}})
    (tmp_path / "job.py").write_text(RAISES)
    result = cli("preview", tmp_path / "job.py", "-i", src, "--set", f"fail={fail}")
    assert result.returncode == code, result.stderr
    assert b"process raised ValueError" in result.stdout
    if code:
        assert "every previewed sample (2 of 2)" in one_line_error(result.stderr)

