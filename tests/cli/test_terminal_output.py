"""What the shell tools write to a terminal (a real pty): `cat` escapes what a terminal would obey, the
tools that write a tar to `-o -` refuse a terminal; piped, both stay byte-exact."""

from __future__ import annotations

import errno
import os
import pty
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.cli.test_inspect import cli, one_line_error
from tests.cli.test_tool_outputs import make_tar, names

HOSTILE = "hi\x1b[2J\x1b]0;TITLE\x07\tx\ny"


def on_terminal(*args, cwd, timeout=120) -> tuple[int, bytes, bytes]:
    """(exit status, what the terminal got, stderr) of the installed `shardflow` with stdout on a pty."""
    exe = shutil.which("shardflow", path=os.path.dirname(sys.executable)) or shutil.which("shardflow")
    cmd = [exe] if exe else [sys.executable, "-m", "shardflow.cli"]
    master, slave = pty.openpty()
    proc = subprocess.Popen([*cmd, *map(str, args)], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=subprocess.PIPE, cwd=cwd)
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError as exc:  # EIO: every writer of the pty has closed it
                if exc.errno != errno.EIO:
                    raise
                break
            if not data:
                break
            seen += data
        stderr = proc.stderr.read()
        status = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return status, bytes(seen), stderr


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `cat -o -` keeps its run directory in ./_shardflow
    return make_tar(tmp_path / "e.tar", {"a.txt": HOSTILE})


def test_cat_escapes_control_characters_on_a_terminal(hostile, tmp_path):
    status, shown, stderr = on_terminal("cat", hostile, cwd=tmp_path)
    assert status == 0, stderr
    assert b"\x1b" not in shown and b"\x07" not in shown
    text = shown.replace(b"\r\n", b"\n")  # the pty's own newline translation
    assert text == b"hi\\x1b[2J\\x1b]0;TITLE\\x07\tx\ny"  # newlines and tabs kept


def test_cat_to_a_pipe_is_byte_exact(hostile):
    result = cli("cat", hostile)
    assert result.returncode == 0
    assert result.stdout == HOSTILE.encode()


@pytest.mark.parametrize("args", [
    ["head", "{tar}", "-o", "-"],
    ["create", "{dir}", "-o", "-"],
    ["cat", "{tar}", "-o", "-"],
])
def test_a_tar_is_not_written_to_a_terminal(hostile, tmp_path, args):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.txt").write_text("x")
    filled = [a.format(tar=hostile, dir=tmp_path / "src") for a in args]
    status, shown, stderr = on_terminal(*filled, cwd=tmp_path)
    assert status == 2, stderr
    assert "terminal" in one_line_error(stderr)
    assert shown == b""
    assert not (tmp_path / "_shardflow").exists()  # refused before a run directory was made
    piped = cli(*filled)  # the same command into a pipe writes the tar
    assert piped.returncode == 0, piped.stderr
    assert names(piped.stdout)
