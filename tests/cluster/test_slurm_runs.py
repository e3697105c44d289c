"""Generated sbatch scripts run on a real one-node Slurm (tests/support/slurm.py): exactly-once through
scancel, a killed worker, the preemption warning and a user bug; the summary from the finalize job."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.samples import read_samples
from tests.support.k8s import glob_temps, input_keys, make_shards, output_keys, temp_files, write_job_file

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SHARDS, PER_SHARD = 6, 4
VENV = Path(sys.executable).parent
BROKEN = '''"""a job with a bug: a name the file forgot to define."""


def process(sample):
    return {"__key__": sample["__key__"], "txt": bytes(SIZE)}  # noqa: F821 (line 5)
'''


def wait_for(condition: Callable[[], object], what: str, timeout: float = 120.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture
def slurm_run(tmp_path: Path, cluster):
    """`shardflow slurm JOB ... --submit` (the same command each call) -> the job ids it printed."""
    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = write_job_file(tmp_path)
    out = tmp_path / "out"

    def submit(*extra: str, job_file: Path = job) -> list[str]:
        result = CliRunner().invoke(main, [
            "slurm", str(job_file), "-i", str(tmp_path / "in" / f"in-{{000000..{SHARDS - 1:06d}}}.tar"),
            "-o", f"{out}/{{name}}.tar", "--tasks-per-array-task", "2", "--shared-fs", "--log-dir",
            str(tmp_path / "logs"), "--setup", f"source {VENV}/activate", "--retries", "2", *extra, "--submit",
        ])
        assert result.exit_code == 0, result.output
        return result.stdout.split()

    submit.out = out
    submit.logs = tmp_path / "logs"
    return submit


def wait_idle(cluster) -> None:
    wait_for(lambda: not cluster.queue(), "the queue to empty", timeout=180)


def check_exactly_once(out: Path) -> None:
    assert temp_files(out) == []
    assert output_keys(out) == input_keys(SHARDS, PER_SHARD)
    run_dir = RunDir(str(out / "_shardflow"))
    assert run_dir.done_ids() == set(range(SHARDS))


def summary(out: Path) -> dict:
    return RunDir(str(out / "_shardflow")).read_json("summary.json")


def log_text(logs: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("*.out")))


def worker_pid(run_dir: Path, index: int) -> int | None:
    """The pid of the `shardflow worker` process of array index `index` (found in /proc by its argv)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--index" in argv and str(run_dir).encode() in argv:
            if argv[argv.index(b"--index") + 1] == str(index).encode():
                return int(entry.name)
    return None


def test_array_writes_every_sample_once_and_finalize_summarises(slurm_run, cluster):
    array_id, finalize_id = slurm_run()
    wait_idle(cluster)
    check_exactly_once(slurm_run.out)
    report = summary(slurm_run.out)
    assert report["ok"] and report["done"] == SHARDS
    assert report["stats"]["samples_out"] == SHARDS * PER_SHARD
    assert f"finalize-{finalize_id}_0.out" in " ".join(p.name for p in slurm_run.logs.iterdir())
    # run again: every task is done, so no array; the finalize job alone, and still one copy of each sample
    (again,) = slurm_run()
    wait_idle(cluster)
    check_exactly_once(slurm_run.out)


def test_scancel_of_one_array_task_then_the_same_command_resumes(slurm_run, cluster):
    array_id, _ = slurm_run("--set", "sleep=0.4")
    wait_for(glob_temps(slurm_run.out, "in-000002.tar"), "index 1 to write a shard")
    subprocess.run(["scancel", f"{array_id}_1"], check=True)
    wait_idle(cluster)
    # nothing under a final name is partial; a temp output could stay only if slurmd's SIGKILL (KillWait,
    # 5 s here, after the SIGTERM) beat the worker's cleanup: the rerun would remove it (asserted below)
    assert all(len(list(read_samples(str(p)))) == PER_SHARD for p in slurm_run.out.glob("*.tar"))
    assert not RunDir(str(slurm_run.out / "_shardflow")).done_ids() >= {2, 3}
    assert not summary(slurm_run.out)["ok"]  # the finalize job ran (afterany) and saw the hole
    ids = slurm_run("--set", "sleep=0.4")
    assert len(ids) == 2  # an array (of the cancelled chunk only) and a finalize job
    wait_idle(cluster)
    check_exactly_once(slurm_run.out)
    assert temp_files(slurm_run.out) == []
    assert summary(slurm_run.out)["ok"]


def test_worker_killed_mid_shard_is_retried_in_its_allocation(slurm_run, cluster):
    slurm_run("--set", "sleep=0.4")
    wait_for(glob_temps(slurm_run.out, "in-000002.tar"), "index 1 to write a shard")
    pid = wait_for(lambda: worker_pid(slurm_run.out / "_shardflow", 1), "the worker of index 1")
    os.kill(pid, signal.SIGKILL)
    wait_idle(cluster)
    check_exactly_once(slurm_run.out)
    assert "transient failure (exit 137), retry 1 of 2" in log_text(slurm_run.logs)
    assert summary(slurm_run.out)["ok"]


def test_preemption_warning_stops_cleanly_and_requeues(slurm_run, cluster):
    array_id, _ = slurm_run("--set", "sleep=0.4")
    task = f"{array_id}_1"
    wait_for(glob_temps(slurm_run.out, "in-000002.tar"), "index 1 to write a shard")
    # what Slurm does --signal-seconds before the time limit (or a site's preemption): USR1 to the batch shell
    subprocess.run(["scancel", "--signal=USR1", "--batch", task], check=True)
    wait_for(lambda: "stopped by the warning signal" in log_text(slurm_run.logs), "the worker to stop")
    # Slurm holds a requeued job for 2 minutes (EligibleTime); a test need not wait that out
    wait_for(lambda: cluster.queue() and any(line.startswith(task + " PENDING") for line in cluster.queue()),
             "the requeued array task")
    subprocess.run(["scontrol", "update", f"jobid={task}", "StartTime=now"], check=True)
    wait_idle(cluster)
    logs = log_text(slurm_run.logs)
    assert "index 1 stopped by SIGUSR1" in logs
    check_exactly_once(slurm_run.out)
    assert summary(slurm_run.out)["ok"]


def test_user_bug_stops_the_array_with_file_and_line(slurm_run, cluster, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    slurm_run("--array-parallelism", "1", job_file=broken)
    wait_idle(cluster)
    run_dir = RunDir(str(slurm_run.out / "_shardflow"))
    (failed,) = run_dir.failed_ids()  # the first chunk's first task; the rest of the array was cancelled
    record = run_dir.read_json(f"failed/{failed:06d}.json")
    assert record["kind"] == "user"
    assert "broken.py\", line 5, in process" in record["error"] or "broken.py, line 5, in process" in record["error"]
    assert "name 'SIZE' is not defined" in record["error"]
    assert "cancelling array job" in log_text(slurm_run.logs)
    assert not run_dir.done_ids()
    assert not summary(slurm_run.out)["ok"]


def test_job_run_on_slurm_reports_like_the_other_backends(tmp_path, cluster):
    from shardflow.job.jobfile import load_job

    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = load_job(str(write_job_file(tmp_path)), inputs=str(tmp_path / "in" / "in-{000000..000005}.tar"),
                   outputs=f"{tmp_path}/out/{{name}}.tar")
    report = job.run("slurm", shared_fs=True, tasks_per_array_task=3, setup=[f"source {VENV}/activate"],
                     log_dir=str(tmp_path / "logs"), poll=0.5, progress=False)
    assert report.ok and report.done == SHARDS
    assert report.stats.samples_out == SHARDS * PER_SHARD
    check_exactly_once(tmp_path / "out")


def test_interrupted_run_cancels_what_it_submitted(tmp_path, cluster):
    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = write_job_file(tmp_path)
    log = tmp_path / "run.log"
    code = (f"from shardflow.job.jobfile import load_job\n"
            f"job = load_job({str(job)!r}, inputs={str(tmp_path / 'in' / 'in-{000000..000005}.tar')!r}, "
            f"outputs={str(tmp_path / 'out' / '{name}.tar')!r}, overrides={{'sleep': 0.5}})\n"
            f"job.run('slurm', shared_fs=True, setup=['source {VENV}/activate'], log_dir={str(tmp_path / 'logs')!r}, "
            "poll=0.5, progress=False)\n")
    with open(log, "wb") as stream:  # stdin is no terminal: Ctrl-C cancels without asking
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=stream,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: cluster.queue(), "the submitted array")
        wait_for(glob_temps(tmp_path / "out", "in-*.tar"), "a shard being written")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "cancelled Slurm job(s)" in text, text
    wait_idle(cluster)  # scancel'ed, not run to the end
    assert RunDir(str(tmp_path / "out" / "_shardflow")).done_ids() != set(range(SHARDS))
    assert temp_files(tmp_path / "out") == []


def test_ctrl_c_at_a_terminal_asks_and_no_leaves_the_jobs_running(tmp_path, cluster):
    import pty

    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    job = write_job_file(tmp_path)
    code = (f"from shardflow.job.jobfile import load_job\n"
            f"job = load_job({str(job)!r}, inputs={str(tmp_path / 'in' / 'in-{000000..000005}.tar')!r}, "
            f"outputs={str(tmp_path / 'out' / '{name}.tar')!r}, overrides={{'sleep': 0.5}})\n"
            f"job.run('slurm', shared_fs=True, setup=['source {VENV}/activate'], log_dir={str(tmp_path / 'logs')!r}, "
            "poll=0.5, progress=False)\n")
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = bytearray()

    def read_until(text: bytes, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in seen:
            ready, _, _ = select.select([controller], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {text!r} on the terminal: {bytes(seen)!r}")
            seen.extend(os.read(controller, 4096))

    try:
        read_until(b"shardflow: submitted")
        wait_for(glob_temps(tmp_path / "out", "in-*.tar"), "a shard being written")
        proc.send_signal(signal.SIGINT)
        read_until(b"[Y/n]")
        os.write(controller, b"n\n")
        proc.wait(timeout=60)
        left = cluster.queue()
        assert left, "answering no must leave the array running"
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    wait_idle(cluster)  # the array ran on unwatched; its finalize job wrote the summary
    check_exactly_once(tmp_path / "out")
    assert summary(tmp_path / "out")["ok"]
