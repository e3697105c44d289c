"""Resume and interruption with real `shardflow run` subprocesses: SIGKILL, SIGINT, SIGTERM, reruns."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, cli_popen, keys_in, make_shards, spec, tars, temp_files, write_job

SLOW_JOB = """
    '''Copies samples slowly (so a run can be interrupted), rolling over every 5 samples.'''
    import time

    JOB = dict(maxcount=5)
    PARAMS = dict(delay=0.04)

    def process(sample):
        time.sleep(PARAMS["delay"])
        return {"__key__": sample["__key__"], "jpg": sample["jpg"], "cls": sample["__key__"][-2:]}
"""
SHARDS, PER_SHARD = 12, 16


@pytest.fixture()
def slow_run(tmp_path):
    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = write_job(tmp_path, SLOW_JOB, "slow.py")
    args = ["run", job, "--inputs", spec(tmp_path / "in", "in", SHARDS),
            "--outputs", str(tmp_path / "out" / "{name}.tar"),
            "--workers", "2", "--no-progress"]
    return tmp_path, args


def _wait_for_markers(run_dir: Path, count: int, process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(list((run_dir / "done").glob("*.json"))) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.02)


def _all_inputs_once(tmp_path: Path) -> None:
    expected = {f"s{i:06d}" for i in range(SHARDS * PER_SHARD)}
    counts = keys_in(tars(tmp_path / "out"))
    assert set(counts) == expected
    assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v != 1}
    assert temp_files(tmp_path / "out") == []


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_accounts_for_every_sample_once(slow_run):
    tmp_path, args = slow_run
    run_dir = tmp_path / "out" / "_shardflow"
    process = cli_popen(*args, start_new_session=True)
    _wait_for_markers(run_dir, 3, process)
    os.killpg(process.pid, signal.SIGKILL)  # driver and workers die at once, mid-write
    process.communicate(timeout=30)
    done_before = len(list((run_dir / "done").glob("*.json")))
    assert 3 <= done_before < SHARDS

    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert f"12/12 tasks done ({done_before} already done before), 0 failed" in rerun.stdout
    _all_inputs_once(tmp_path)
    # every shard is whole and of the size rollover promises (5, 5, 5, 1 per task)
    sizes = sorted(sum(1 for _ in read_samples(str(p))) for p in tars(tmp_path / "out"))
    assert sizes == [1] * SHARDS + [5] * (3 * SHARDS)

    # resume does no work the second time: nothing processed, no output rewritten
    mtimes = {p: p.stat().st_mtime_ns for p in tars(tmp_path / "out")}
    again = cli(*args, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["processed"] == 0 and report["skipped"] == SHARDS and report["ok"]
    assert {p: p.stat().st_mtime_ns for p in tars(tmp_path / "out")} == mtimes


@pytest.mark.slow
def test_killed_driver_takes_its_workers_with_it(slow_run):
    tmp_path, args = slow_run
    process = cli_popen(*args, start_new_session=True)
    _wait_for_markers(tmp_path / "out" / "_shardflow", 1, process)
    workers = psutil.Process(process.pid).children(recursive=True)
    assert workers
    process.send_signal(signal.SIGKILL)  # only the driver: kill -9 PID
    process.communicate(timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"orphaned workers still running: {alive}"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_stops_cleanly_and_a_rerun_finishes(slow_run, how):
    tmp_path, args = slow_run
    run_dir = tmp_path / "out" / "_shardflow"
    process = cli_popen(*args, start_new_session=True)
    _wait_for_markers(run_dir, 2, process)
    if how == "ctrl-c":
        os.killpg(process.pid, signal.SIGINT)  # what a terminal sends: driver and workers together
    else:
        process.send_signal(signal.SIGTERM)  # docker stop / kill: the driver alone
    started = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - started < 20
    assert process.returncode == 130, err
    assert "interrupted" in out and "run the same command again to resume" in err
    assert "Traceback" not in err
    # nothing half-written under a final name; no temp files left behind
    assert temp_files(tmp_path / "out") == []
    for shard in tars(tmp_path / "out"):
        assert sum(1 for _ in read_samples(str(shard))) in (1, 5)
    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    _all_inputs_once(tmp_path)


@pytest.mark.slow
def test_a_different_plan_is_refused_unless_forced(tmp_path):
    make_shards(tmp_path / "in", 3, 2)
    job = write_job(tmp_path, """
        PARAMS = dict(suffix="a")
        def process(sample):
            return {"__key__": sample["__key__"], "txt": PARAMS["suffix"]}
    """)
    out = str(tmp_path / "out" / "{name}.tar")
    base = ["run", job, "--outputs", out, "--backend", "serial"]
    assert cli(*base, "--inputs", spec(tmp_path / "in", "in", 3)).returncode == 0

    fewer = cli(*base, "--inputs", spec(tmp_path / "in", "in", 2))
    assert fewer.returncode == 2
    # one word for "start over", whatever changed (issue 29 item 12): --redo, as for a code change
    assert "holds a different plan (3 tasks there, 2 now)" in fewer.stderr and "--redo" in fewer.stderr
    assert "--force" not in fewer.stderr
    other = cli(*base, "--inputs", spec(tmp_path / "in", "in", 3), "--set", "suffix=b")
    assert other.returncode == 2
    assert "same tasks, other job settings: params.suffix 'a' -> 'b'" in other.stderr
    # policies do not change the outputs: they may change between runs
    assert cli(*base, "--inputs", spec(tmp_path / "in", "in", 3), "--set", "on_error=raise").returncode == 0

    forced = cli(*base, "--inputs", spec(tmp_path / "in", "in", 3), "--set", "suffix=b", "--redo")
    assert forced.returncode == 0, forced.stderr
    assert "3/3 tasks done (0 already done before)" in forced.stdout
    assert {s["txt"] for p in tars(tmp_path / "out") for s in read_samples(str(p))} == {b"b"}
    # --force, the older word, still starts over, and says it is deprecated
    alias = cli(*base, "--inputs", spec(tmp_path / "in", "in", 3), "--set", "suffix=c", "--force")
    assert alias.returncode == 0, alias.stderr
    assert "--force is deprecated: it is the same as --redo" in alias.stderr
    assert {s["txt"] for p in tars(tmp_path / "out") for s in read_samples(str(p))} == {b"c"}
