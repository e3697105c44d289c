"""Issue 11, seeing and trying: tracebacks with file and line, --debug, --limit, preview, live progress,
status --watch, one CLI convention. Real `shardflow` subprocesses on small generated shards."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time

import pytest

from shardflow.job.progress import Progress, known_total
from shardflow.rundir.tasks import Task, TaskResult
from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, cli_env, cli_popen, errors_logged, make_shards, spec, tars, write_job

BROKEN_JOB = """
    '''Fails in a helper on every key ending in 3.'''
    def helper(sample):
        return sample["nope"]

    def process(sample):
        if sample["__key__"].endswith("3"):
            helper(sample)
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""
HELPER_LINE = 4  # `return sample["nope"]` in the file BROKEN_JOB writes (it starts with a blank line)


@pytest.fixture()
def broken(tmp_path):
    make_shards(tmp_path / "in", 2, 10)
    job = write_job(tmp_path, BROKEN_JOB, "broken.py")
    args = [job, "--inputs", spec(tmp_path / "in", "in", 2), "-o", str(tmp_path / "out" / "{name}.tar")]
    return tmp_path, job, args


def test_traceback_of_user_code_is_kept_and_shown_with_file_and_line(broken):
    tmp_path, job, args = broken
    done = cli("run", *args, "-b", "serial")
    assert done.returncode == 0, done.stderr
    where = f'File "{job}", line {HELPER_LINE}, in helper'
    assert where in done.stdout and "KeyError: 'nope'" in done.stdout  # the run report
    status = cli("status", tmp_path / "out" / "_shardflow")
    assert status.returncode == 0, status.stderr
    assert where in status.stdout and "(2x, first: task 0" in status.stdout
    assert 'in process\n' in status.stdout and "helper(sample)" in status.stdout
    logged = errors_logged(tmp_path / "out" / "_shardflow")
    assert len(logged) == 2 and len({e["traceback"] for e in logged}) == 1
    assert all(where in e["trace"] for e in logged)  # first occurrences of the digest in each task
    as_json = json.loads(cli("status", tmp_path / "out" / "_shardflow", "--json").stdout)
    assert as_json["tracebacks"][0]["count"] == 2 and where in as_json["tracebacks"][0]["trace"]


def test_tracebacks_are_bounded_per_distinct_error(tmp_path):
    make_shards(tmp_path / "in", 1, 12)
    job = write_job(tmp_path, """
        def process(sample):
            raise ValueError("always")
    """)
    done = cli("run", job, "-i", spec(tmp_path / "in", "in", 1), "-o", tmp_path / "out" / "{name}.tar",
               "-b", "serial", "--set", "max_failure_rate=1.0")
    assert done.returncode == 0, done.stderr
    logged = errors_logged(tmp_path / "out" / "_shardflow")
    assert len(logged) == 12 and sum("trace" in e for e in logged) == 3


def test_debug_raises_the_first_error_with_its_traceback(broken):
    tmp_path, job, args = broken
    done = cli("run", *args, "--debug")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert f'File "{job}", line {HELPER_LINE}, in helper' in done.stderr and "KeyError: 'nope'" in done.stderr
    assert tars(tmp_path / "out") == []  # the task stopped at its first error: nothing published


@pytest.mark.slow
def test_limit_runs_a_trial_into_scratch_never_into_the_real_run(broken):
    tmp_path, job, args = broken
    trial = cli("run", *args, "--limit", "2", "-w", "2")
    assert trial.returncode == 0, trial.stderr
    assert "a trial on 2 samples per task" in trial.stderr
    scratch = tmp_path / "out" / "_shardflow-limit-broken"
    shards = tars(scratch / "shards")
    assert [p.name for p in shards] == ["in-000000.tar", "in-000001.tar"]
    assert [len(list(read_samples(str(p)))) for p in shards] == [2, 2]
    assert tars(tmp_path / "out") == shards  # nothing beside the scratch folder
    assert not (tmp_path / "out" / "_shardflow" / "done").exists()
    one = cli("run", *args, "--limit", "3", "--limit-tasks", "1", "-b", "serial")  # a new trial starts afresh
    assert one.returncode == 0, one.stderr
    assert "1/1 tasks done (0 already done before)" in one.stdout
    real = cli("run", *args, "-b", "serial")
    assert real.returncode == 0, real.stderr
    assert "2/2 tasks done (0 already done before)" in real.stdout
    assert [len(list(read_samples(str(tmp_path / "out" / f"in-00000{i}.tar")))) for i in (0, 1)] == [9, 9]


PREVIEW_JOB = """
    '''Turns images into arrays.'''
    import numpy as np
    DECODE = "rgb8"

    def process(sample):
        image = sample["jpg"]
        return {"__key__": sample["__key__"], "png": image[:, ::-1], "cls": int(image.mean() > 100),
                "npy": np.zeros((2, 3), dtype="float32")}
"""


def test_preview_shows_what_process_returns_and_writes_no_shards(tmp_path):
    make_shards(tmp_path / "in", 2, 4)
    job = write_job(tmp_path, PREVIEW_JOB, "arrays.py")
    sheet = tmp_path / "sheet.png"
    shown = cli("preview", job, "-i", spec(tmp_path / "in", "in", 2), "-n", "3", "--sheet", sheet)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.count("1 output(s)") == 3 and "'s000003'" not in text
    assert re.search(r"png: numpy\.ndarray shape \(24, 32, 3\) uint8, \d+ bytes encoded", text)
    assert re.search(r"npy: numpy\.ndarray shape \(2, 3\) float32, \d+ bytes encoded", text)
    assert "cls: builtins.int" in text and "contact sheet of 3 images" in text
    from PIL import Image

    from shardflow.tools.sheet import sheet_size

    assert Image.open(sheet).size == sheet_size(3, 6, 160)  # show's layout: a caption band under each row
    assert not list(tmp_path.rglob("*.tar")) == [] and tars(tmp_path) == tars(tmp_path / "in")
    assert not list(tmp_path.rglob("_shardflow*"))


def test_preview_shows_a_failing_sample_with_its_traceback(broken):
    tmp_path, job, _ = broken
    shown = cli("preview", job, "-i", spec(tmp_path / "in", "in", 1), "-n", "5")
    assert shown.returncode == 0, shown.stderr
    assert "sample 's000003': process raised KeyError: 'nope'" in shown.stdout
    assert f'File "{job}", line {HELPER_LINE}, in helper' in shown.stdout


SLOW_JOB = """
    import time

    def process(sample):
        time.sleep(0.06)
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""


@pytest.mark.slow
def test_heartbeat_lines_while_tasks_run_when_stderr_is_not_a_terminal(tmp_path):
    make_shards(tmp_path / "in", 2, 16)
    job = write_job(tmp_path, SLOW_JOB, "slow.py")
    done = cli("run", job, "-i", spec(tmp_path / "in", "in", 2), "-o", tmp_path / "out" / "{name}.tar",
               "-b", "serial", "--heartbeat", "0.4")
    assert done.returncode == 0, done.stderr
    beats = [line for line in done.stderr.splitlines() if line.startswith("shardflow: ") and "samples/s" in line]
    assert len(beats) >= 3, done.stderr
    # counts move while the first task runs (before any task ended), and the last line has the end
    assert any(re.match(r"shardflow: [1-9]\d* samples, 0/2 tasks", line) for line in beats), beats
    assert re.match(r"shardflow: 32/~?32 samples \(100%\), 2/2 tasks", beats[-1]), beats[-1]


def test_progress_line_has_total_and_eta_when_a_manifest_gives_the_total():
    stream = io.StringIO()
    progress = Progress(4, 1, enabled=False, total_samples=300, stream=stream)
    progress.add_samples(100)
    line = progress.line()
    assert line.startswith("shardflow: 100/300 samples (33%), 1/4 tasks,") and "ETA 0:00:0" in line
    unknown = Progress(4, 0, enabled=False, stream=stream)
    unknown.add_samples(50)
    assert "ETA" not in unknown.line()
    unknown.task_finished(TaskResult(0, "done"))
    unknown.samples_of_finished = 50
    assert unknown.estimated_total() == 200 and "/~200 samples" in unknown.line()


def test_known_total_reads_the_summary_beside_the_inputs():
    tasks = [Task(0, ("d/a.tar",), "o/a.tar", "o/a_{part}.tar"), Task(1, ("d/b.tar",), "o/b.tar", "o/b_{part}.tar")]
    summary = {"shards": [{"url": "/elsewhere/a.tar", "nsamples": 5}, {"url": "b.tar", "nsamples": 7}]}
    assert known_total(tasks, lambda url: summary if url == "d/_shardflow/summary.json" else None) == 12
    assert known_total(tasks, lambda url: None) is None


@pytest.mark.slow
def test_status_watch_redraws_until_the_run_is_complete(tmp_path):
    make_shards(tmp_path / "in", 2, 16)
    job = write_job(tmp_path, SLOW_JOB, "slow.py")
    run_dir = tmp_path / "out" / "_shardflow"
    running = cli_popen("run", job, "-i", spec(tmp_path / "in", "in", 2), "-o", tmp_path / "out" / "{name}.tar",
                        "-b", "serial", "--no-progress")
    deadline = time.monotonic() + 60
    while not (run_dir / "plan.json").exists():
        assert running.poll() is None and time.monotonic() < deadline, running.communicate()
        time.sleep(0.05)
    watch = cli("status", run_dir, "--watch", "--interval", "0.2")
    assert running.wait(timeout=60) == 0
    assert watch.returncode == 0, watch.stderr
    lines = watch.stdout.splitlines()
    assert len(lines) >= 3 and "0/2 tasks done, 0 failed, 2 pending" in lines[0]
    assert lines[-1].endswith("2/2 tasks done, 0 failed, 0 pending; 32 samples in done tasks, 0 sample errors")


@pytest.mark.slow
def test_one_cli_convention_and_python_dash_m(tmp_path):
    make_shards(tmp_path / "in", 1, 2)
    shard = tmp_path / "in" / "in-000000.tar"
    listed = subprocess.run([sys.executable, "-m", "shardflow", "ls", str(shard), "-S", "auto_mkdir=true"],
                            capture_output=True, text=True, env=cli_env())
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("s000000\t")
    old = cli("ls", shard, "-o", "anon=true")  # -o never means a storage option
    assert old.returncode == 2 and "No such option '-o'" in old.stderr
    for command in ("run", "plan", "status", "k8s", "argo", "ls", "cat", "stats", "worker"):
        assert "-S, --storage-option" in cli(command, "--help").stdout, command
    assert "-o, --outputs" in cli("run", "--help").stdout and "-o, --outputs" in cli("plan", "--help").stdout
