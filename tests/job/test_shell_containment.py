"""`shardflow map` under hostile or careless commands (issue 26 items 9-11, issue 29 item 16), run as a
user runs it (the CLI in a subprocess): children that leave the session, a command that swaps its
folder for a link, long CJK keys, secrets given as --env, and what a failing command reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import shardflow as sf

CJK_KEY = "数据集" * 20  # 60 characters, 180 bytes of UTF-8, 540 once percent-encoded


def shard(path: Path, keys: list[str]) -> str:
    with sf.TarWriter(str(path)) as w:
        for i, key in enumerate(keys):
            w.write({"__key__": key, "txt": f"hello {i}\n".encode()})
    return str(path)


def shardflow(*args, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardflow.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_children_in_a_new_session_end_with_the_command(tmp_path):
    spec = shard(tmp_path / "in.tar", [f"k{i}" for i in range(6)])
    pids = tmp_path / "pids"
    pids.mkdir()
    # each sample starts two processes that leave the command's session: `setsid` in the background, and
    # `setsid -f` whose parent exits at once; the command itself exits 0 right away
    command = ('setsid sh -c \'echo $$ > "$PIDS/a$1"; exec sleep 300\' x $$ & '
               'setsid -f sh -c \'echo $$ > "$PIDS/b$1"; exec sleep 301\' x $$; '
               'while [ "$(ls "$PIDS" | grep -c "$$")" -lt 2 ]; do sleep 0.01; done')
    try:
        result = shardflow("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", command, "-p", 3,
                           "--pass-env", "PIDS", "--no-progress", cwd=tmp_path, env={"PIDS": str(pids)})
        assert result.returncode == 0, result.stderr
        started = [int(p.read_text()) for p in pids.iterdir()]
        assert len(started) == 12
        deadline = time.monotonic() + 5
        while any(map(alive, started)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in started if alive(pid)]
    finally:
        for p in pids.iterdir():
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_a_command_that_swaps_its_folder_for_a_link_reads_nothing_through_it(tmp_path):
    secret = tmp_path / "private"
    secret.mkdir()
    (secret / "k0.txt").write_text("the private file")
    spec = shard(tmp_path / "in.tar", ["k0", "k1"])
    command = f'if [ -e k0.txt ]; then cd "$HOME" && mv s gone && ln -s {secret} s; fi'
    result = shardflow("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", command, "--on-error", "skip",
                       "--no-progress", cwd=tmp_path)
    assert "replaced its own directory" in (tmp_path / "out" / "_shardflow" / "errors" / "000000.jsonl").read_text()
    assert result.returncode == 0, result.stderr
    assert [s["__key__"] for s in sf.read_samples(str(tmp_path / "out" / "in.tar"))] == ["k1"]
    assert b"the private file" not in (tmp_path / "out" / "in.tar").read_bytes()


def test_a_long_cjk_key_gets_a_short_file_name_and_keeps_its_key(tmp_path):
    spec = shard(tmp_path / "in.tar", [CJK_KEY, "plain"])
    result = shardflow("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", "ls > names.lst", "--no-progress",
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    samples = {s["__key__"]: s for s in sf.read_samples(str(tmp_path / "out" / "in.tar"))}
    assert set(samples) == {CJK_KEY, "plain"} and samples[CJK_KEY]["txt"] == b"hello 0\n"
    name = [n for n in samples[CJK_KEY]["lst"].decode().split() if n.endswith(".txt")][0]
    assert len(name.encode()) < 255 and "~" in name


def test_secret_looking_env_is_refused_and_pass_env_keeps_it_out_of_the_run(tmp_path):
    spec = shard(tmp_path / "in.tar", ["k0", "k1"])
    out = tmp_path / "out"
    refused = shardflow("map", spec, "-o", out / "{name}.tar", "-c", "true", "--env", "API_TOKEN=s3cr3t-value",
                        "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2 and "--pass-env API_TOKEN" in refused.stderr, refused.stderr
    assert "s3cr3t-value" not in refused.stderr
    passed = shardflow("map", spec, "-o", out / "{name}.tar", "-c", 'printf %s "$API_TOKEN" > seen.tok',
                       "--pass-env", "API_TOKEN", "--no-progress", cwd=tmp_path, env={"API_TOKEN": "s3cr3t-value"})
    assert passed.returncode == 0, passed.stderr
    assert next(sf.read_samples(str(out / "in.tar")))["tok"] == b"s3cr3t-value"  # it reached the command
    for path in (out / "_shardflow").rglob("*"):
        if path.is_file():
            assert b"s3cr3t-value" not in path.read_bytes(), path  # and nothing in the run directory
    job_file = tmp_path / "job.py"
    job_file.write_text('COMMAND = "true"\nENV = {"HF_TOKEN": "hf_abc"}\n')
    from_file = shardflow("run", job_file, "-i", spec, "-o", tmp_path / "o2" / "{name}.tar", "--no-progress",
                          cwd=tmp_path)
    assert from_file.returncode == 2 and "PASS_ENV = ['HF_TOKEN']" in from_file.stderr, from_file.stderr


def test_a_failing_command_reports_the_command_its_status_and_stderr(tmp_path):
    spec = shard(tmp_path / "in.tar", [f"k{i}" for i in range(4)])
    result = shardflow("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", "echo no such tool >&2; exit 3",
                       "--no-progress", cwd=tmp_path)
    assert result.returncode == 1
    text = result.stdout + result.stderr
    assert "the command failed on every sample (4 of 4)" in text
    assert "command 'echo no such tool >&2; exit 3' exited with status 3; stderr: 'no such tool'" in text
    assert "Traceback" not in text and "a bug in the job" not in text and "process() raised" not in text
    one = shardflow("map", spec, "-o", tmp_path / "one" / "{name}.tar", "--no-progress", "-c",
                    '[ ! -e k2.txt ] || { echo bad >&2; exit 4; }', cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    status = shardflow("status", tmp_path / "one" / "_shardflow", cwd=tmp_path)
    shown = status.stdout + status.stderr
    assert "key 'k2' [process] CommandFailed: command" in shown and "exited with status 4; stderr: 'bad'" in shown
    assert "Traceback" not in shown and "distinct errors" not in shown
