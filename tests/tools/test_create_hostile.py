"""`shardflow create` on hostile inputs (issue 26 items 4 and 16), run as a user runs it (a subprocess):
links planted in a tree, and recipes that name devices, FIFOs, files outside their folder and URLs."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.http_server import serve_directory

SECRET = "hunter2-not-for-shards"


def create(*args, cwd: Path, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDFLOW_TEST_SECRET": SECRET}
    return subprocess.run([sys.executable, "-m", "shardflow.cli", "create", *map(str, args)], cwd=cwd, env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_links_in_a_tree_are_skipped_unless_dereferenced_and_never_lead_out_unasked(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (tree / "a" / "1.txt").write_text("one")
    (tree / "a" / "2.txt").write_text("two")
    os.symlink("/proc/self/environ", tree / "a" / "env.txt")
    os.symlink("../../outside/secret.txt", tree / "a" / "secret.txt")
    os.symlink("2.txt", tree / "a" / "3.txt")  # inside the tree
    os.mkfifo(tree / "a" / "fifo.txt")

    plain = create(tree, "-o", tmp_path / "plain.tar", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert set(members(tmp_path / "plain.tar")) == {"a/1.txt", "a/2.txt"}
    assert "skipped 'a/env.txt': a symbolic link" in plain.stderr and "--dereference" in plain.stderr
    assert "skipped 'a/fifo.txt': a FIFO" in plain.stderr

    followed = create(tree, "-o", tmp_path / "deref.tar", "--dereference", cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    packed = members(tmp_path / "deref.tar")
    assert set(packed) == {"a/1.txt", "a/2.txt", "a/3.txt"} and packed["a/3.txt"] == b"two"
    assert "outside the tree (pass --allow-outside" in followed.stderr
    assert SECRET.encode() not in (tmp_path / "deref.tar").read_bytes()

    asked = create(tree, "-o", tmp_path / "all.tar", "--dereference", "--allow-outside", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    assert members(tmp_path / "all.tar")["a/secret.txt"] == SECRET.encode()  # only when the user said so


def test_recipes_read_only_under_their_folder_bounded_and_never_hang(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "ok.txt").write_text("fine")
    (tmp_path / "secret.txt").write_text(SECRET)
    os.mkfifo(folder / "fifo.txt")

    def recipe(line: str, *flags: str) -> subprocess.CompletedProcess:
        (folder / "r.tsv").write_text(f"a/0.cls\ttext:0\n{line}\n")
        out = tmp_path / "o.tar"
        out.unlink(missing_ok=True)
        result = create(folder / "r.tsv", "-o", out, *flags, cwd=tmp_path, timeout=60)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 1, result.stderr
        assert result.returncode == 0 or not out.exists()
        return result

    ok = recipe("a/0.txt\trecipes/ok.txt")  # read from the current directory, and under the recipe's folder
    assert ok.returncode == 0, ok.stderr
    assert members(tmp_path / "o.tar")["a/0.txt"] == b"fine"
    for source in ("/dev/zero", "/proc/self/environ", "recipes/../secret.txt", str(tmp_path / "secret.txt"),
                   "http://169.254.169.254/latest/meta-data/iam/"):
        refused = recipe(f"a/0.txt\t{source}")
        assert refused.returncode == 2 and "outside the recipe's folder" in refused.stderr, source
        assert "--allow-outside" in refused.stderr
    zero = recipe("a/0.txt\t/dev/zero", "--allow-outside")  # asked for, yet a device is not a file
    assert zero.returncode == 1 and "character device, not a regular file" in zero.stderr
    fifo = recipe("a/0.txt\trecipes/fifo.txt")  # would wait for a writer forever
    assert fifo.returncode == 1 and "a FIFO, not a regular file" in fifo.stderr
    endless = recipe("a/0.txt\tpipe:yes", "--allow-pipe", "--max-member-size", "100000")
    assert endless.returncode == 1 and "more than 100000 bytes" in endless.stderr
    (folder / "big.txt").write_bytes(b"x" * 300_000)
    big = recipe("a/0.txt\trecipes/big.txt", "--max-member-size", "100000")
    assert big.returncode == 1 and "300000 bytes, over the limit" in big.stderr


def test_a_recipe_reaches_a_url_only_when_allowed(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "x.txt").write_text("remote")
    stats: dict = {}
    with serve_directory(served, stats=stats) as base:
        (tmp_path / "r.tsv").write_text(f"a/0.txt\t{base}/x.txt\n")
        refused = create(tmp_path / "r.tsv", "-o", tmp_path / "o.tar", cwd=tmp_path)
        assert refused.returncode == 2 and "outside the recipe's folder" in refused.stderr
        assert stats.get("gets", 0) == 0  # refused before any request
        allowed = create(tmp_path / "r.tsv", "-o", tmp_path / "o.tar", "--allow-outside", cwd=tmp_path)
        assert allowed.returncode == 0, allowed.stderr
    assert members(tmp_path / "o.tar")["a/0.txt"] == b"remote"
