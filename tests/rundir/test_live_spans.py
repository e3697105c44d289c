"""A driver killed mid-run (SIGKILL: no report) leaves the summary of every 1,000-task range it finished
(rundir.summaries.LiveSpans), so its next run reads those summaries, not one marker per task (100,000
GETs at 100k tasks on S3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shardflow.job.shard_job import ShardJob
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.summaries import SPAN, summary_name
from tests.support.jobs import cli_env, make_shards, spec

N = SPAN + 10

CHILD = """
import os, signal, sys
import shardflow as sf

def copy_then_die(sample):
    if sample["__key__"] == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)  # the driver itself: serial runs tasks in it
    return {k: v for k, v in sample.items() if k != "__url__"}

if __name__ == "__main__":
    sf.ShardJob(copy_then_die, sys.argv[1], sys.argv[2] + "/{name}.tar").run("serial", progress=False)
"""


def copy(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def resume(inputs: str, out: Path):
    """The same job from this process (its code differs from the killed one's: resume_anyway)."""
    job = ShardJob(copy, inputs, str(out / "{name}.tar"), run_dir=str(out / "_shardflow"))
    return job.run("serial", progress=False, resume_anyway=True)


def _killed_at(tmp_path: Path, key: int) -> tuple[str, Path]:
    make_shards(tmp_path / "in", N, 1, size=(4, 4))
    inputs, out = spec(tmp_path / "in", "in", N), tmp_path / "out"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    killed = subprocess.run([sys.executable, str(script), inputs, str(out), f"s{key:06d}"], env=cli_env(),
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr
    return inputs, out


def test_a_killed_driver_leaves_the_summaries_of_the_ranges_it_finished(tmp_path):
    inputs, out = _killed_at(tmp_path, SPAN + 5)
    run_dir = RunDir(str(out / "_shardflow"))
    assert run_dir.done_ids() == set(range(SPAN + 5))
    assert not (out / "_shardflow" / "summary.json").exists()  # no report: the driver died
    span = json.loads((out / "_shardflow" / summary_name(0, SPAN)).read_text())
    assert [e["url"] for e in span["shards"]] == [str(out / f"in-{t:06d}.tar") for t in range(SPAN)]
    assert span["stats"]["samples_in"] == SPAN and span["first"] == 0 and span["stop"] == SPAN

    report = resume(inputs, out)
    assert report.ok and report.done == N and report.processed == 5
    assert [e["url"] for e in report.shards] == [str(out / f"in-{t:06d}.tar") for t in range(N)]


def test_a_range_partly_done_before_is_written_whole_by_the_report(tmp_path):
    """A range with tasks an earlier run finished is not written as the run goes (this run has only part
    of its entries): the report writes it, with every entry."""
    inputs, out = _killed_at(tmp_path, 500)
    assert not (out / "_shardflow" / "summaries").exists()
    report = resume(inputs, out)
    assert report.ok and report.processed == N - 500
    span = json.loads((out / "_shardflow" / summary_name(0, SPAN)).read_text())
    assert [e["url"] for e in span["shards"]] == [str(out / f"in-{t:06d}.tar") for t in range(SPAN)]
