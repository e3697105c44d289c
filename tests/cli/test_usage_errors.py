"""Exit statuses a script can rely on: a spec that cannot be parsed is a usage error (2) for the inspecting
commands too, as it is for `run` and every tool that runs a job; a damaged shard stays a failure (1)."""

from __future__ import annotations

import pytest

from tests.cli.test_inspect import cli, one_line_error


@pytest.mark.parametrize("command", ["ls", "stats"])
def test_an_invalid_dataset_spec_exits_2_in_one_line(tmp_path, command):
    spec = tmp_path / "train.yaml"
    spec.write_text("collections: [1\n")
    done = cli(command, spec)
    assert done.returncode == 2
    assert "train.yaml" in one_line_error(done.stderr)


def test_a_damaged_shard_is_still_a_failure_not_a_usage_error(tmp_path):
    shard = tmp_path / "bad.tar"
    shard.write_bytes(b"\x01" * 1000)
    done = cli("stats", shard)
    assert done.returncode == 1


@pytest.fixture
def two_shards(tmp_path):
    from shardflow.tools.demo import write_synthetic_shards

    write_synthetic_shards(tmp_path / "in", 2, 3, size=(16, 16))
    return str(tmp_path / "in" / "train-{000000..000001}.tar")


@pytest.mark.parametrize("command", [["ls"], ["stats", "--json"], ["tsv", "-f", "json.label"], ["cat", "-e", "json"],
                                     ["head", "-n", "2", "-o", "{tmp}/head.tar"], ["index", "-o", "{tmp}/summary.json"],
                                     ["split", "--maxcount", "2", "-o", "{tmp}/split/{{name}}-{{part:02d}}.tar"],
                                     ["sort", "--by", "json.label", "-o", "{tmp}/sorted/{{name}}.tar"],
                                     ["cat", "-o", "{tmp}/all.tar"]])
def test_every_command_that_reads_shards_takes_them_as_dash_i_too(tmp_path, two_shards, command):
    """"Every command takes -i/--inputs": the tools took only SPEC arguments and said "No such option: -i"."""
    args = [a.format(tmp=tmp_path) for a in command]
    flagged = cli(*args, "-i", two_shards)
    assert flagged.returncode == 0, flagged.stderr
    if "-o" not in args:  # the printing commands print the same as with the SPEC argument
        assert flagged.stdout and flagged.stdout == cli(args[0], two_shards, *args[1:]).stdout


def test_no_shards_at_all_is_a_usage_error():
    done = cli("ls")
    assert done.returncode == 2 and b"SPEC... or -i/--inputs SPEC" in done.stderr


def test_a_repeated_dash_i_reads_every_spec_in_the_job_commands(tmp_path, two_shards):
    """`run -i a.tar -i b.tar` kept only the last `-i` ("1 tasks over 1 input shards"): the shards named
    before it were silently left out. Now the specs are joined in order, in every command that loads a job."""
    first, second = (two_shards.replace("{000000..000001}", n) for n in ("000000", "000001"))
    planned = cli("plan", "reshard", "-i", first, "-i", second, "-o", f"{tmp_path}/out/{{name}}.tar",
                  "--run-dir", f"{tmp_path}/plan-run")
    assert planned.returncode == 0, planned.stderr
    assert b"2 tasks over 2 input shards" in planned.stdout
    ran = cli("run", "reshard", "-i", first, "-i", second, "-o", f"{tmp_path}/out/{{name}}.tar",
              "--run-dir", f"{tmp_path}/run", "--backend", "serial")
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train-000000.tar", "train-000001.tar"]


def test_a_dataset_spec_cannot_be_joined_with_another_dash_i(tmp_path, two_shards):
    spec = tmp_path / "train.yaml"
    spec.write_text(f"collections:\n  - shards: '{two_shards}'\n")
    done = cli("plan", "reshard", "-i", str(spec), "-i", two_shards, "-o", f"{tmp_path}/out/{{name}}.tar")
    assert done.returncode == 2
    assert "cannot be joined" in done.stderr.decode() and "train.yaml" in done.stderr.decode()
