"""Where the shell tools write: an output never replaces one of the command's inputs (the runner's rule,
job.guard.inputs_at, for head, create, tsv, show, index and report too), head keeps keys unique as
`cat -o` does, and `-o -` (standard output) carries nothing but the tar and is written on every run."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.cli.test_inspect import cli, one_line_error


def make_tar(path, members: dict[str, str]):
    with tarfile.open(path, "w") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def names(data_or_path) -> list[str]:
    source = {"fileobj": io.BytesIO(data_or_path)} if isinstance(data_or_path, bytes) else {"name": data_or_path}
    with tarfile.open(mode="r", **source) as tar:
        return tar.getnames()


@pytest.fixture
def shard(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the commands' default run directory (./_shardflow) lands here
    return make_tar(tmp_path / "in.tar", {"a.txt": "1", "b.txt": "2", "c.txt": "3"})


# ------------------------------------------------------------------------------------------------
# 1. an output never replaces an input


@pytest.mark.parametrize("args", [
    ["head", "{in}", "-n", "1", "-o", "{in}"],
    ["head", "{in}", "-n", "1", "-o", "{dotted}"],  # another spelling of the same file
    ["tsv", "{in}", "-f", "txt", "-o", "{in}"],
    ["show", "{in}", "-o", "{in}"],
    ["index", "{in}", "-o", "{in}"],
])
def test_a_tool_refuses_to_write_over_its_input(shard, args):
    before = shard.read_bytes()
    dotted = shard.parent / "sub" / ".." / shard.name
    (shard.parent / "sub").mkdir()
    result = cli(*[a.format(**{"in": shard, "dotted": dotted}) for a in args])
    assert result.returncode == 2, result.stderr
    assert "is the input" in one_line_error(result.stderr)
    assert shard.read_bytes() == before


def test_report_refuses_to_write_over_a_shard_of_its_run(shard, tmp_path):
    assert cli("cat", shard, "-o", tmp_path / "all.tar", "-b", "serial").returncode == 0
    for target in (shard, tmp_path / "all.tar", tmp_path / "_shardflow" / "plan.json"):
        before = target.read_bytes()
        result = cli("report", tmp_path / "_shardflow", "-o", target)
        assert result.returncode == 2, result.stderr
        assert "is the input" in one_line_error(result.stderr)
        assert target.read_bytes() == before
    assert cli("report", tmp_path / "_shardflow", "-o", tmp_path / "r.html").returncode == 0


def test_head_replaces_a_file_that_is_not_an_input(shard, tmp_path):
    """Like cp or tar -cf (docs/shell-tools.md): an existing non-input file under the output name is replaced."""
    other = tmp_path / "old.tar"
    other.write_text("not a shard")
    assert cli("head", shard, "-n", "1", "-o", other).returncode == 0
    assert names(other) == ["a.txt"]


def test_create_leaves_its_own_output_out_of_the_folder_it_packs(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "a.txt").write_text("a")
    (tree / "b.txt").write_text("b")
    first = cli("create", tree, "-o", tree / "out.tar")
    assert first.returncode == 0, first.stderr
    second = cli("create", tree, "-o", tree / "out.tar")  # out.tar is now in the tree: not packed
    assert second.returncode == 0, second.stderr
    assert names(tree / "out.tar") == ["a.txt", "b.txt"]
    assert "out.tar left out" in second.stderr.decode()
    (tree / "out.tar").unlink()
    parts = cli("create", tree, "-o", tree / "p-{part:02d}.tar", "--maxcount", "1")
    assert parts.returncode == 0, parts.stderr
    again = cli("create", tree, "-o", tree / "p-{part:02d}.tar", "--maxcount", "1")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tree.glob("p-*.tar")) == ["p-00.tar", "p-01.tar"]  # not p-02, p-03 of itself


def test_create_refuses_a_recipe_that_names_its_output_or_is_it(tmp_path):
    (tmp_path / "b.txt").write_text("b")
    recipe = tmp_path / "recipe.txt"
    recipe.write_text(f"x.txt {tmp_path / 'b.txt'}\n")
    for output in (recipe, tmp_path / "b.txt"):
        before = output.read_bytes()
        result = cli("create", recipe, "-o", output, "--allow-outside")
        assert result.returncode == 2, result.stderr
        one_line_error(result.stderr)
        assert output.read_bytes() == before


# ------------------------------------------------------------------------------------------------
# 2. head writes shards its reader takes


def test_head_leaves_out_a_key_seen_in_an_earlier_shard(tmp_path):
    p = make_tar(tmp_path / "p.tar", {"000000.txt": "a", "000001.txt": "b"})
    q = make_tar(tmp_path / "q.tar", {"000000.txt": "c", "000002.txt": "d"})
    result = cli("head", p, q, "-n", "10", "-o", tmp_path / "pq.tar")
    assert result.returncode == 0, result.stderr
    assert "'000000'" in result.stderr.decode() and "produced twice" in result.stderr.decode()
    assert names(tmp_path / "pq.tar") == ["000000.txt", "000001.txt", "000002.txt"]
    assert cli("ls", tmp_path / "pq.tar").returncode == 0


# ------------------------------------------------------------------------------------------------
# 3. -o - : standard output


def test_cat_to_stdout_holds_only_the_tar_and_every_run_writes_it(shard):
    first = cli("cat", shard, "-o", "-")
    assert first.returncode == 0, first.stderr
    assert names(first.stdout) == ["a.txt", "b.txt", "c.txt"]
    assert b"tasks done" in first.stderr  # the report, on stderr
    again = cli("cat", shard, "-o", "-")  # not "already done": a stream cannot be resumed
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


def test_rollover_into_stdout_is_refused_before_anything_is_written(shard, tmp_path):
    result = cli("split", shard, "-o", "-", "--maxcount", "1")
    assert result.returncode == 2
    assert "roll over" in one_line_error(result.stderr)
    assert result.stdout == b""
    assert not list(tmp_path.glob("-*"))


def test_create_to_stdout_holds_only_the_tar(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    result = cli("create", tmp_path, "-o", "-")
    assert result.returncode == 0, result.stderr
    assert names(result.stdout) == ["a.txt"]
    assert b"1 samples in 1 shard(s)" in result.stderr


def test_stdin_input_is_named_stdin(shard, tmp_path):
    result = cli("split", "-", "-o", tmp_path / "o" / "{name}-{part}.tar", "--maxcount", "2", "-b", "serial",
                 input=shard.read_bytes())
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "o").glob("*.tar")) == ["stdin-0.tar", "stdin-1.tar"]


def test_stdin_is_read_by_the_driver_on_the_processes_backend(shard, tmp_path):
    """A pool worker reading `-` found an empty stream ("empty file"): stdin belongs to the driver, so a
    task reading it runs there, whatever the backend's pool policy says (here: always a pool)."""
    other = tmp_path / "other.tar"
    other.write_bytes(shard.read_bytes())
    result = cli("split", "-", other, "-o", tmp_path / "o" / "{name}-{part}.tar", "--maxcount", "2",
                 "-b", "processes", input=shard.read_bytes(), env={"SHARDFLOW_ALWAYS_POOL": "1"})
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "o").glob("*.tar"))
    assert names == ["other-0.tar", "other-1.tar", "stdin-0.tar", "stdin-1.tar"]
