"""`--retry-failed` (`job.run(retry_failed=True)`): the finished tasks that dropped samples under
on_error="skip" run again, and only they (with the unfinished ones), once the cause is fixed.

The job raises for the keys listed in a file, so the fix is editing that file (no code change): 4 shards
of 8 samples, the first run drops samples in tasks 1 and 3 and skips one (SkipSample) in task 2.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardflow as sf
from shardflow.cli import main
from shardflow.errors import JobError
from shardflow.rundir.status import read_status
from shardflow.rundir.summaries import summaries_holding
from shardflow.shards.writer import TarWriter
from tests.support.jobs import cli, cli_popen, keys_in, tars, temp_files, write_job

SHARDS, PER_SHARD = 4, 8
BAD = ["s000009", "s000026", "s000027"]  # tasks 1 and 3
SKIPPED = "s000020"  # task 2: the function's own choice, not a loss
ALL_KEPT = {f"s{i:06d}" for i in range(SHARDS * PER_SHARD)} - {SKIPPED}


def reject_listed(listing: str, sample: dict) -> dict:
    """Raises for the keys listed in `listing` (the 'bug' is fixed by emptying the file)."""
    key = sample["__key__"]
    if key == SKIPPED:
        raise sf.SkipSample("deliberate")
    if key in Path(listing).read_text().split():
        raise ValueError(f"listed key {key}")
    return sample


def reject_listed_v2(listing: str, sample: dict) -> dict:
    """The same job, its code changed (the fix is a code change: nothing is rejected any more)."""
    if sample["__key__"] == SKIPPED:
        raise sf.SkipSample("deliberate")
    return dict(sample)


def _inputs(folder: Path) -> str:
    folder.mkdir(parents=True)
    for shard in range(SHARDS):
        with TarWriter(str(folder / f"in-{shard:06d}.tar")) as writer:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                writer.write({"__key__": f"s{i:06d}", "txt": f"sample {i}".encode()})
    return str(folder / f"in-{{000000..{SHARDS - 1:06d}}}.tar")


@pytest.fixture()
def dropped(tmp_path):
    """A finished first run that dropped samples in tasks 1 and 3: (job maker, out folder, run dir, listing)."""
    listing = tmp_path / "bad.txt"
    listing.write_text("\n".join(BAD))
    inputs = _inputs(tmp_path / "in")

    def make(fn=reject_listed):
        return sf.ShardJob(functools.partial(fn, str(listing)), inputs, str(tmp_path / "out" / "{name}.tar"),
                           run_dir=str(tmp_path / "run"), on_error="skip")

    first = make().run(backend="serial", progress=False)
    assert first.ok and first.stats.failed == len(BAD) and first.stats.skipped == 1
    assert sorted(p.name for p in (tmp_path / "run" / "errors").iterdir()) == ["000001.jsonl", "000003.jsonl"]
    return make, tmp_path / "out", tmp_path / "run", listing


def _untouched(out: Path) -> dict[str, int]:
    """Set the outputs of tasks 0 and 2 to an old mtime, so a rewrite of them shows."""
    for name in ("in-000000.tar", "in-000002.tar"):
        os.utime(out / name, ns=(1_000_000_000, 1_000_000_000))
    return {name: (out / name).stat().st_mtime_ns for name in ("in-000000.tar", "in-000002.tar")}


def _every_sample_once(out: Path) -> None:
    counts = keys_in(tars(out))
    assert set(counts) == ALL_KEPT and set(counts.values()) == {1}
    assert temp_files(out) == []


def test_retry_failed_runs_exactly_the_tasks_that_dropped_samples(dropped):
    make, out, run_dir, listing = dropped
    mtimes = _untouched(out)
    listing.write_text("")  # the fix
    report = make().run(backend="serial", progress=False, retry_failed=True)
    assert report.notes == ["--retry-failed: retrying 2 finished tasks that dropped samples (tasks 1, 3): their "
                            "outputs and error logs are written again"]
    assert report.ok and (report.done, report.skipped, report.processed) == (4, 2, 2 * PER_SHARD)
    # the new results, not old + new; task 2's deliberate skip is still counted (it did not run again)
    s = report.stats
    assert (s.samples_in, s.samples_out, s.failed, s.skipped) == (32, 31, 0, 1)
    assert not s.fail_reasons and dict(s.skip_reasons) == {"deliberate": 1}
    assert {n: (out / n).stat().st_mtime_ns for n in mtimes} == mtimes  # tasks 0 and 2 did not run
    _every_sample_once(out)
    assert list((run_dir / "errors").iterdir()) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ok"] and summary["stats"]["failed"] == 0 and summary["stats"]["samples_in"] == 32
    assert len(summary["shards"]) == SHARDS
    status = read_status(str(run_dir))
    assert len(status.done) == 4 and not status.pending and not status.failed
    assert (status.stats.samples_in, status.stats.failed, status.stats.skipped) == (32, 0, 1)
    assert status.error_count == 0


def test_a_retry_after_a_code_change_is_refused_then_runs_with_resume_anyway(dropped):
    make, out, run_dir, _listing = dropped
    mtimes = _untouched(out)
    fixed = make(reject_listed_v2)
    with pytest.raises(JobError, match="--retry-failed --resume-anyway"):
        fixed.run(backend="serial", progress=False, retry_failed=True)
    assert len(list((run_dir / "done").iterdir())) == 4  # refused before anything was forgotten
    assert len(list((run_dir / "errors").iterdir())) == 2
    with pytest.raises(JobError, match="pass one of them"):
        fixed.run(backend="serial", progress=False, retry_failed=True, redo=True)
    report = fixed.run(backend="serial", progress=False, retry_failed=True, resume_anyway=True)
    assert report.ok and (report.skipped, report.processed, report.stats.failed) == (2, 2 * PER_SHARD, 0)
    assert {n: (out / n).stat().st_mtime_ns for n in mtimes} == mtimes
    _every_sample_once(out)


def test_nothing_to_retry_says_so_and_runs_no_task(tmp_path):
    listing = tmp_path / "bad.txt"
    listing.write_text("")  # only task 2's SkipSample: a choice of the function, not a dropped sample
    job = sf.ShardJob(functools.partial(reject_listed, str(listing)), _inputs(tmp_path / "in"),
                      str(tmp_path / "out" / "{name}.tar"), run_dir=str(tmp_path / "run"))
    assert job.run(backend="serial", progress=False).stats.skipped == 1
    report = job.run(backend="serial", progress=False, retry_failed=True)
    assert report.notes == ["--retry-failed: no finished task dropped samples: nothing to retry; resuming as a "
                            "plain rerun"]
    assert report.ok and (report.skipped, report.processed) == (4, 0)
    with pytest.raises(JobError, match="trial"):  # a trial runs in a scratch run: nothing of its own to retry
        job.run(backend="serial", progress=False, retry_failed=True, limit=2)


def test_the_cli_flag(dropped):
    _make, out, run_dir, listing = dropped
    # the run dir's plan was written by the Python job above; the CLI runs a job file over it
    job = write_job(out.parent, f"""
        from pathlib import Path
        import shardflow as sf

        def process(sample):
            if sample["__key__"] == {SKIPPED!r}:
                raise sf.SkipSample("deliberate")
            if sample["__key__"] in Path({str(listing)!r}).read_text().split():
                raise ValueError("listed")
            return sample
    """, "listed.py")
    args = ["run", str(job), "-i", str(out.parent / "in" / "in-{000000..000003}.tar"), "-o",
            str(out / "{name}.tar"), "--run-dir", str(run_dir), "-b", "serial", "--no-progress"]
    runner = CliRunner()
    both = runner.invoke(main, [*args, "--retry-failed", "--redo"])
    assert both.exit_code == 2 and "redo=True (--redo) runs every task again" in both.output
    changed = runner.invoke(main, [*args, "--retry-failed"])  # a job file, not the function that planned it
    assert changed.exit_code == 2 and "--retry-failed --resume-anyway" in changed.output
    listing.write_text("")
    fixed = runner.invoke(main, [*args, "--retry-failed", "--resume-anyway"])
    assert fixed.exit_code == 0, fixed.output
    assert "retrying 2 finished tasks that dropped samples (tasks 1, 3)" in fixed.output
    assert "4/4 tasks done (2 already done before), 0 failed" in fixed.output
    assert "1 skipped, 0 failed" in fixed.output
    again = runner.invoke(main, [*args, "--retry-failed"])
    assert again.exit_code == 0 and "no finished task dropped samples" in again.output
    assert "4/4 tasks done (4 already done before)" in again.output
    _every_sample_once(out)


SLOW_JOB = """
    '''Copies samples (slowly when SLOW is set: a retry can be killed mid-task); raises for listed keys;
    parts of 3 samples, so a killed task has replaced some of its parts and not others.'''
    import os
    import time

    JOB = dict(maxcount=3)

    def process(sample):
        time.sleep(float(os.environ.get("SLOW", "0")))
        if sample["__key__"] in open({listing!r}).read().split():
            raise ValueError("listed")
        return sample
"""


@pytest.mark.slow
def test_a_retry_killed_mid_task_then_a_plain_rerun_has_every_sample_once(tmp_path, monkeypatch):
    listing = tmp_path / "bad.txt"
    listing.write_text("\n".join(BAD))
    job = write_job(tmp_path, SLOW_JOB.format(listing=str(listing)), "slow.py")
    out, run_dir = tmp_path / "out", tmp_path / "out" / "_shardflow"
    args = ["run", str(job), "-i", _inputs(tmp_path / "in"), "-o", str(out / "{name}.tar"), "--no-progress"]
    first = cli(*args, "-b", "serial")
    assert first.returncode == 0 and "3 failed" in first.stdout, first.stderr
    assert "once the cause is fixed, rerun with --retry-failed" in first.stderr  # the way out, said
    listing.write_text("")
    first_parts = [out / "in-000001.tar", out / "in-000003.tar"]
    before = [p.stat().st_mtime_ns for p in first_parts]
    monkeypatch.setenv("SLOW", "0.4")  # the retry's workers inherit it (the job's code does not change)
    process = cli_popen(*args, "--retry-failed", "--workers", "2", start_new_session=True)
    monkeypatch.delenv("SLOW")
    deadline = time.monotonic() + 60
    while [p.stat().st_mtime_ns for p in first_parts] == before:  # until the retry replaced a first part
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the retry replaced no part"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # mid-task: 4 of its 8 samples are written, 1.6 s of work is left
    process.communicate(timeout=30)
    replaced = [task for task, part, mtime in zip((1, 3), first_parts, before) if part.stat().st_mtime_ns != mtime]
    assert replaced and not any((run_dir / "done" / f"{i:06d}.json").exists() for i in replaced)

    rerun = cli(*args)  # a plain rerun: the forgotten tasks are not done, so it runs them
    assert rerun.returncode == 0, rerun.stderr
    assert "4/4 tasks done" in rerun.stdout and "0 skipped, 0 failed" in rerun.stdout
    counts = keys_in(tars(out))
    assert set(counts) == {f"s{i:06d}" for i in range(SHARDS * PER_SHARD)} and set(counts.values()) == {1}
    assert temp_files(out) == [] and list((run_dir / "errors").iterdir()) == []
    status = cli("status", str(run_dir), "--json")
    state = json.loads(status.stdout)
    assert status.returncode == 0, status.stderr
    assert state["done"] == 4 and state["stats"]["failed"] == 0 and state["stats"]["samples_in"] == 32


def test_markers_of_an_older_shardflow_without_records_are_read(dropped):
    make, out, run_dir, listing = dropped
    for record in (run_dir / "records").iterdir():  # done markers only, as an older shardflow left them
        record.unlink()
    listing.write_text("")
    report = make().run(backend="serial", progress=False, retry_failed=True)
    assert (report.skipped, report.processed, report.stats.failed) == (2, 2 * PER_SHARD, 0)
    _every_sample_once(out)


def test_every_summary_holding_a_retried_task_is_named():
    names = ["000000000-000001000.json", "000000000-000000010.json", "000000010-000000020.json",
             "000001000-000002000.json", "000002000-000002005.json", "notes.txt"]
    assert summaries_holding(names, [15, 2004]) == ["000000000-000001000.json", "000000010-000000020.json",
                                                    "000002000-000002005.json"]
    assert summaries_holding(names, [1000]) == ["000001000-000002000.json"]
    assert summaries_holding(names, []) == []


def test_a_run_directory_on_a_store(tmp_path):
    """memory:// (fsspec, like an object store: no local paths, bulk deletes): the same decision."""
    listing = tmp_path / "bad.txt"
    listing.write_text("\n".join(BAD))
    run_dir = f"memory://retry-failed/{tmp_path.name}"
    job = sf.ShardJob(functools.partial(reject_listed, str(listing)), _inputs(tmp_path / "in"),
                      str(tmp_path / "out" / "{name}.tar"), run_dir=run_dir)
    assert job.run(backend="serial", progress=False).stats.failed == len(BAD)
    listing.write_text("")
    report = job.run(backend="serial", progress=False, retry_failed=True)
    assert report.ok and (report.skipped, report.processed, report.stats.failed) == (2, 2 * PER_SHARD, 0)
    _every_sample_once(tmp_path / "out")
    assert read_status(run_dir).error_count == 0


def test_the_cluster_commands_forget_the_tasks_when_they_write_the_plan(tmp_path):
    listing = tmp_path / "bad.txt"
    listing.write_text("\n".join(BAD))
    inputs, out, run_dir = _inputs(tmp_path / "in"), tmp_path / "out", tmp_path / "run"
    job = write_job(tmp_path, f"""
        from pathlib import Path

        def process(sample):
            if sample["__key__"] in Path({str(listing)!r}).read_text().split():
                raise ValueError("listed")
            return sample
    """, "listed.py")
    where = [str(job), "-i", inputs, "-o", str(out / "{name}.tar"), "--set", "on_error=skip"]
    runner = CliRunner()
    first = runner.invoke(main, ["run", *where, "--run-dir", str(run_dir), "-b", "serial", "--no-progress"])
    assert first.exit_code == 0 and f"{len(BAD)} failed" in first.output, first.output
    listing.write_text("")  # the fix
    prepare = ["worker", "--run-dir", str(run_dir), "--prepare", *where]
    refused = runner.invoke(main, [*prepare, "--retry-failed", "--redo"])
    assert refused.exit_code == 2 and "pass one of them" in refused.output
    forgot = runner.invoke(main, [*prepare, "--retry-failed"])
    assert forgot.exit_code == 0, forgot.output
    assert "retrying 2 finished tasks that dropped samples (tasks 1, 3)" in forgot.stderr
    assert sorted(p.name for p in (run_dir / "done").iterdir()) == ["000000.json", "000002.json"]
    for index in (1, 3):  # the pods of those indexes run them again
        assert runner.invoke(main, ["worker", "--run-dir", str(run_dir), "--index", str(index)]).exit_code == 0
    counts = keys_in(tars(out))
    assert set(counts) == {f"s{i:06d}" for i in range(SHARDS * PER_SHARD)} and set(counts.values()) == {1}
    slurm = runner.invoke(main, ["slurm", *where, "--run-dir", str(run_dir), "--shared-fs", "--retry-failed"])
    assert slurm.exit_code == 0 and "no finished task dropped samples" in slurm.stderr, slurm.output
