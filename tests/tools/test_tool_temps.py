"""A SIGKILLed `shardflow head` leaves its temp beside the output; the next run deletes it, and only the
temps whose writer is provably dead (tools/output_temps.py): never a live run's, never another program's.
create, tsv/show and report write their files the same way and sweep the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from shardflow.rundir.pids import process_identity, start_ticks
from shardflow.shards.writer import ShardWriter
from shardflow.storage.atomic import temp_name
from shardflow.tools.output_temps import remove_dead_writers_temps, writer_tag

HEAD = [sys.executable, "-m", "shardflow.cli", "head", "-n", "7", "a-000.tar", "-", "-o", "out.tar"]
FOREIGN = (".out.tar.tmp-journal", ".out.tar.tmp-0123456789ab")  # another program's; an older release's temp


def write_shard(folder: Path, prefix: str) -> None:
    with ShardWriter(str(folder / f"{prefix}-%03d.tar"), maxcount=10**6) as w:
        for i in range(5):
            w.write({"__key__": f"{prefix}{i:03d}", "bin": os.urandom(2000)})


def temps(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.startswith(".out.tar.tmp-")}


def stalled_head(folder: Path) -> tuple[subprocess.Popen, str]:
    """`shardflow head` copying a-000.tar, then waiting on a standard input that never comes (an upstream
    producer that stalled): it holds its temp until killed. Returns the process and its temp's name."""
    before = temps(folder)
    proc = subprocess.Popen(HEAD, cwd=folder, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (temps(folder) - before):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "head never opened its temp"
        time.sleep(0.02)
    (temp,) = temps(folder) - before
    return proc, temp


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdin.close()
    proc.stderr.close()


def rerun(folder: Path) -> subprocess.CompletedProcess:
    with open(folder / "b-000.tar", "rb") as stdin:
        return subprocess.run(HEAD, cwd=folder, stdin=stdin, capture_output=True, text=True, timeout=120)


def keys(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return [m.name.split(".")[0] for m in tar.getmembers()]


EXPECTED = [f"a{i:03d}" for i in range(5)] + ["b000", "b001"]


@pytest.mark.slow
def test_a_killed_heads_temp_is_removed_by_the_rerun_a_live_ones_is_not(tmp_path):
    write_shard(tmp_path, "a")
    write_shard(tmp_path, "b")
    for name in FOREIGN:
        (tmp_path / name).write_bytes(b"not shardflow's")

    live, live_temp = stalled_head(tmp_path)
    try:
        done = rerun(tmp_path)  # a second run while the first still writes: both may commit, neither is swept
        assert done.returncode == 0, done.stderr
        assert keys(tmp_path / "out.tar") == EXPECTED
        assert temps(tmp_path) == {live_temp, *FOREIGN}
    finally:
        kill(live)
    assert temps(tmp_path) == {live_temp, *FOREIGN}  # SIGKILL: the temp stays behind
    os.unlink(tmp_path / "out.tar")

    done = rerun(tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"removed {tmp_path / live_temp}, left by a killed run" in done.stderr
    assert keys(tmp_path / "out.tar") == EXPECTED
    assert temps(tmp_path) == set(FOREIGN)  # the dead writer's temp gone; other files untouched


def test_the_sweep_judges_each_temp_by_its_writer(tmp_path):
    out = tmp_path / "out.tar"
    exited = subprocess.Popen(["true"])
    exited.wait()
    me = process_identity()
    other_output = temp_name(str(tmp_path / "other.tar"), writer_tag({"pid": exited.pid, "started": 1}))
    files = {
        "dead": temp_name(str(out), writer_tag({"pid": exited.pid, "started": 1})),
        "pid reused": temp_name(str(out), writer_tag({"pid": me["pid"], "started": start_ticks(me["pid"]) + 1})),
        "live": temp_name(str(out), writer_tag()),
        "elsewhere": temp_name(str(out), "w00000000p1s1"),  # another host / boot / container: its pid means nothing
        "foreign": str(tmp_path / ".out.tar.tmp-journal"),
        "other output": other_output,
    }
    for path in files.values():
        Path(path).write_bytes(b"x")
    assert sorted(remove_dead_writers_temps([str(out)])) == sorted([files["dead"], files["pid reused"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        os.path.basename(files[k]) for k in ("live", "elsewhere", "foreign", "other output"))
    assert remove_dead_writers_temps([str(out), str(tmp_path / "other.tar")]) == [other_output]  # one listing
    assert remove_dead_writers_temps([str(tmp_path / "missing" / "out.tar")]) == []


def test_create_removes_a_killed_runs_temps_of_its_parts(tmp_path):
    """`shardflow create` names its temps the same way and sweeps its parts' dead-writer temps."""
    from click.testing import CliRunner

    from shardflow.cli import main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"s{i}.txt").write_text(f"sample {i}")
    out = tmp_path / "out"
    out.mkdir()
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead = temp_name(str(out / "p-000001.tar"), writer_tag({"pid": exited.pid, "started": 1}))
    parent = os.getppid()  # alive while this test runs (the test's own tag is create's here: in-process)
    live = temp_name(str(out / "p-000000.tar"), writer_tag({"pid": parent, "started": start_ticks(parent)}))
    foreign = out / ".p-000000.tar.tmp-journal"
    for path in (dead, live, foreign):
        Path(path).write_bytes(b"x")
    done = CliRunner().invoke(main, ["create", str(src), "-o", str(out / "p-{part:06d}.tar"), "--maxcount", "3"],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["p-000000.tar", "p-000001.tar", os.path.basename(live), foreign.name])


def test_tsv_removes_a_killed_runs_temp_of_its_file(tmp_path):
    from click.testing import CliRunner

    from shardflow.cli import main

    write_shard(tmp_path, "a")
    out = tmp_path / "t.tsv"
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead = Path(temp_name(str(out), writer_tag({"pid": exited.pid, "started": 1})))
    dead.write_bytes(b"x")
    done = CliRunner().invoke(main, ["tsv", str(tmp_path / "a-000.tar"), "-o", str(out)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert out.read_text().count("\n") == 6 and not dead.exists()
