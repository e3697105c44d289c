"""`shardflow sort` (issue 26 item 14), run as a user runs it: a NaN label sorts the same in memory and
spilled, and a sort killed mid-spill leaves no samples behind in the temp folder once any sort runs again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import shardflow as sf

LABELS = ["3", "NaN", "1", "2.5", "NaN", "0", "-1", "NaN", "7", "2"]


def shardflow(*args, cwd: Path, **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "shardflow.cli", *map(str, args)], cwd=cwd, text=True, **kwargs)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def labelled_shard(path: Path, count: int = 40) -> None:
    with sf.TarWriter(str(path)) as w:
        for i in range(count):
            label = LABELS[i % len(LABELS)]
            w.write({"__key__": f"k{i:03d}", "json": f'{{"label": {label}}}'.encode(), "txt": b"x" * 300})


def test_a_nan_label_sorts_the_same_in_memory_and_spilled(tmp_path):
    labelled_shard(tmp_path / "in.tar")
    orders = []
    for memory in ("1e9", "1"):  # all in memory; a spilled run per sample, merged
        out = tmp_path / f"out-{memory}"
        code, text = finish(shardflow("sort", "in.tar", "-o", f"{out}/{{name}}.tar", "--by", "json.label",
                                      "--memory", memory, "--tmpdir", tmp_path, "-b", "serial", "--no-progress",
                                      cwd=tmp_path))
        assert code == 0, text
        orders.append([s["__key__"] for s in sf.read_samples(str(out / "in.tar"))])
    assert orders[0] == orders[1]
    nans = [f"k{i:03d}" for i in range(40) if LABELS[i % len(LABELS)] == "NaN"]
    assert orders[0][-len(nans):] == nans  # after every number, in input order (stable)


def test_a_sort_killed_mid_spill_leaves_nothing_once_a_sort_runs_again(tmp_path):
    labelled_shard(tmp_path / "in.tar")
    spills = tmp_path / "spills"
    spills.mkdir()
    cut = (tmp_path / "in.tar").stat().st_size - 4096  # no end of archive: the reader waits for more
    # the pipe: input runs in its own session: it writes its pid, to be ended by this test
    stuck = shardflow("sort", f"pipe:echo $$ > pipe.pid; head -c {cut} in.tar; exec sleep 300", "-o",
                      "out/{name}.tar", "--by", "json.label", "--memory", "1", "--tmpdir", spills, "--allow-pipe",
                      "-b", "serial", "--no-progress", cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(spills.glob("shardflow-sort-*/run-*.pkl")) and time.monotonic() < deadline:
            assert stuck.poll() is None
            time.sleep(0.05)
        assert list(spills.glob("shardflow-sort-*/run-*.pkl")), "the sort never spilled"
    finally:
        os.killpg(stuck.pid, signal.SIGKILL)
        stuck.wait()
        if (tmp_path / "pipe.pid").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int((tmp_path / "pipe.pid").read_text()), signal.SIGKILL)
    assert list(spills.glob("shardflow-sort-*/run-*.pkl"))  # what SIGKILL leaves: samples, pickled
    code, text = finish(shardflow("sort", "in.tar", "-o", "again/{name}.tar", "--memory", "1", "--tmpdir", spills,
                                  "-b", "serial", "--no-progress", cwd=tmp_path))
    assert code == 0, text
    assert not list(spills.iterdir())
