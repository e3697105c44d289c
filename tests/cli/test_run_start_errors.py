"""`shardflow run` that cannot start says why in one line, exit 2:
- a `pipe:` input without allowing pipes: how to allow them, before any task (the command never runs);
  `--set allow_pipe=true` runs it;
- an unreadable plan.json: the file named and `--redo`, which plans again over it and succeeds."""

from __future__ import annotations

from tests.support.jobs import cli, keys_in, make_shards, tars


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("shardflow: error: ")
    return lines[0]


def test_run_refuses_a_pipe_input_with_exit_2_and_one_line(tmp_path):
    (shard,) = make_shards(tmp_path / "in", 1, 3)
    ran = tmp_path / "ran"
    args = ["run", "filter", "-i", f"pipe:touch {ran}; cat {shard}", "-o", f"{tmp_path}/out/{{task}}.tar",
            "-b", "serial", "--no-progress"]
    result = cli(*args)  # cli() leaves SHARDFLOW_ALLOW_PIPE out of the environment
    assert result.returncode == 2, result.stderr
    assert "--set allow_pipe=true" in _one_line(result.stderr)
    assert not ran.exists() and not (tmp_path / "out" / "_shardflow" / "plan.json").exists()
    allowed = cli(*args, "--set", "allow_pipe=true")
    assert allowed.returncode == 0, allowed.stderr
    assert ran.exists()


def test_run_over_an_unreadable_plan_names_it_and_redo_plans_again(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    args = ["run", "filter", "-i", f"{tmp_path}/in/in-{{000000..000001}}.tar", "-o", f"{tmp_path}/out/{{task}}.tar",
            "-b", "serial", "--no-progress"]
    assert cli(*args).returncode == 0
    plan = tmp_path / "out" / "_shardflow" / "plan.json"
    plan.write_bytes(plan.read_bytes()[:100])  # truncated by hand
    result = cli(*args)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert str(plan) in line and "cannot be read" in line and "--redo" in line
    redone = cli(*args, "--redo")
    assert redone.returncode == 0, redone.stderr
    assert sum(keys_in(tars(tmp_path / "out")).values()) == 6
    assert cli(*args).returncode == 0  # and the plan reads again
