"""Ctrl-C during a batched run (real `shardflow run`, processes backend): the overlap threads stop with
their task, nothing half-written stays, and a rerun writes every sample once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from shardflow.shards.samples import read_samples
from tests.job.test_resume import SHARDS, _all_inputs_once, _wait_for_markers
from tests.support.jobs import cli, cli_popen, make_shards, spec, tars, temp_files, write_job

SLOW_BATCHES = """
    '''Copies batches slowly (so a run can be interrupted), rolling over every 5 samples.'''
    import time

    JOB = dict(maxcount=5, batch_size=3)

    def process_batch(batch):
        time.sleep(0.1)
        return [{"__key__": s["__key__"], "jpg": s["jpg"], "cls": s["__key__"][-2:]} for s in batch]
"""


@pytest.mark.slow
def test_ctrl_c_stops_a_batched_run_cleanly_and_a_rerun_finishes(tmp_path):
    make_shards(tmp_path / "in", SHARDS, 16)
    job = write_job(tmp_path, SLOW_BATCHES, "slow_batches.py")
    args = ["run", job, "--inputs", spec(tmp_path / "in", "in", SHARDS), "--outputs",
            str(tmp_path / "out" / "{name}.tar"), "--workers", "2", "--no-progress"]
    process = cli_popen(*args, start_new_session=True)
    _wait_for_markers(tmp_path / "out" / "_shardflow", 2, process)
    os.killpg(process.pid, signal.SIGINT)
    started = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - started < 20
    assert process.returncode == 130, err
    assert "Traceback" not in err and temp_files(tmp_path / "out") == []
    for shard in tars(tmp_path / "out"):
        assert sum(1 for _ in read_samples(str(shard))) in (1, 5)
    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    _all_inputs_once(tmp_path)
