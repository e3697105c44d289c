"""The command shows a ShardflowWarning as one line, `shardflow: warning: <message>`, with text that
came from data escaped (cli/__init__.py sets warnings.formatwarning): no source line of shardflow, no raw
escape sequence from a shard's name reaching the terminal."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile

import pytest


def _tar_bytes() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    return out.getvalue()


@pytest.mark.parametrize("suffix, pack", [(".tar", lambda b: b), (".tar.gz", gzip.compress)])
def test_a_reader_warning_is_one_escaped_line(tmp_path, suffix, pack):
    shard = tmp_path / f"y\x1b[31mRED{suffix}"
    shard.write_bytes(pack(_tar_bytes()) + b"junk")
    done = subprocess.run([sys.executable, "-W", "default", "-m", "shardflow", "ls", str(shard)],
                          capture_output=True, text=True, errors="surrogateescape", timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warned = [line for line in lines if "warning" in line.lower()]
    assert len(warned) == 1 and warned[0].startswith(f"shardflow: warning: shard {tmp_path}/y\\x1b[31mRED"), lines
    assert "4 bytes" in warned[0] and "\x1b" not in done.stderr and "tar_" not in done.stderr, lines
