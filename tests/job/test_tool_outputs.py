"""Issue 29 item 3: the shell tools' output guard, run as a user runs them (the CLI in a subprocess, in
the folder that holds the shards): other shards in the folder never stop a run, only an existing
output name that no run of this run directory wrote does; every tool that writes shards takes the
same --overwrite; a refusal leaves nothing behind; a rerun of a glob that now matches the first run's
outputs resumes the plan stored in its run directory."""

from __future__ import annotations

import pytest

from tests.support.jobs import cli, make_shards


@pytest.fixture()
def folder(tmp_path):
    make_shards(tmp_path, 2, 30, name="x")
    (tmp_path / "x-000000.tar").rename(tmp_path / "a.tar")
    (tmp_path / "x-000001.tar").rename(tmp_path / "b.tar")
    return tmp_path


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_split_in_a_folder_holding_other_shards_runs(folder):
    done = cli("split", "a.tar", "-o", "a-{part:04d}.tar", "--maxcount", "20", "-b", "serial", cwd=folder)
    assert done.returncode == 0, done.stderr
    assert _names(folder) == ["_shardflow", "a-0000.tar", "a-0001.tar", "a.tar", "b.tar"]


@pytest.mark.slow
def test_a_tool_refuses_only_an_existing_output_name_and_leaves_nothing_behind(folder):
    (folder / "a-0000.tar").write_bytes((folder / "b.tar").read_bytes())  # someone else's shard, under our name
    before = _names(folder)
    refused = cli("split", "a.tar", "-o", "a-{part:04d}.tar", "--maxcount", "20", "-b", "serial", cwd=folder)
    assert refused.returncode == 2
    assert "output a-0000.tar in" in refused.stderr and "already exists" in refused.stderr
    assert "--overwrite" in refused.stderr and "Traceback" not in refused.stderr
    assert _names(folder) == before  # no empty _shardflow/
    for tool in (["cat", "a.tar", "-o", "a-{part:04d}.tar"], ["sort", "a.tar", "-o", "a-{part:04d}.tar"],
                 ["map", "a.tar", "-c", "true", "-o", "a-{part:04d}.tar"]):
        again = cli(*tool, "-b", "serial", cwd=folder)
        assert again.returncode == 2 and "already exists" in again.stderr, (tool, again.stderr)
        assert _names(folder) == before, tool
    replaced = cli("split", "a.tar", "-o", "a-{part:04d}.tar", "--maxcount", "20", "-b", "serial", "--overwrite",
                   cwd=folder)
    assert replaced.returncode == 0, replaced.stderr


@pytest.mark.slow
def test_split_of_a_glob_run_twice_resumes_from_its_plan(folder):
    args = ["split", "*.tar", "-o", "{name}-{part:04d}.tar", "--maxcount", "20", "-b", "serial"]
    first = cli(*args, cwd=folder)
    assert first.returncode == 0, first.stderr
    outputs = {p.name: p.read_bytes() for p in folder.glob("*-*.tar")}
    assert sorted(outputs) == ["a-0000.tar", "a-0001.tar", "b-0000.tar", "b-0001.tar"]
    again = cli(*args, cwd=folder)
    assert again.returncode == 0, again.stderr
    assert "2/2 tasks done (2 already done before)" in again.stdout
    assert {p.name: p.read_bytes() for p in folder.glob("*-*.tar")} == outputs
