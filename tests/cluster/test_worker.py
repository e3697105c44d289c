"""`shardflow worker`: chunks of a planned job, exit codes, SIGTERM, --finalize."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import fsspec
import pytest
from fsspec.spec import AbstractFileSystem

from shardflow.cluster import contract, worker
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.run_dir import RunDir
from tests.support.k8s import (
    glob_temps,
    input_keys,
    make_shards,
    output_keys,
    shardflow_command,
    temp_files,
    write_job_file,
)


def identity(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def explode(sample):
    raise ValueError("boom")


def plan(tmp: Path, shards: int = 3, *, fn=identity, truncate: int | None = None, **kw) -> tuple[str, Path]:
    make_shards(tmp / "in", shards, 4, truncate=truncate)
    job = ShardJob(fn, str(tmp / "in" / f"in-{{000000..{shards - 1:06d}}}.tar"), f"{tmp}/out/{{name}}.tar", **kw)
    job.prepare()
    return job.run_dir, tmp / "out"


def run(url: str, index: int, per: int = 1, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = worker.run_chunk(url, index, per, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def test_chunks_cover_the_plan_once():
    chunks = [contract.chunk_of(i, 4, 10) for i in range(contract.chunk_count(10, 4))]
    assert [list(c.task_ids) for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(contract.WorkerExit) as exc:
        contract.chunk_of(3, 4, 10)
    assert exc.value.code == contract.EXIT_STOP


def test_chunk_runs_its_tasks_and_reruns_are_noops(tmp_path):
    url, out = plan(tmp_path, 3)
    code, log, _ = run(url, 0, 2)
    assert code == contract.EXIT_OK
    assert RunDir(url).done_ids() == {0, 1}
    code, log2, _ = run(url, 0, 2)
    assert code == 0 and "task 0: skipped" in log2 and "task 1: skipped" in log2
    assert run(url, 1, 2)[0] == 0
    assert output_keys(out) == input_keys(3, 4)


def test_bad_input_exit_65_and_the_rest_of_the_chunk_still_runs(tmp_path):
    url, out = plan(tmp_path, 2, truncate=0)
    code, log, _ = run(url, 0, 2)
    assert code == contract.EXIT_BAD_INPUT == 65
    rd = RunDir(url)
    assert rd.done_ids() == {1}
    assert rd.read_json("failed/000000.json")["kind"] == "input"
    assert output_keys(out) == input_keys(2, 4, skip={0})


class DeniedFileSystem(AbstractFileSystem):
    """A store that answers every request with 403 (not retried inside one read: fast)."""

    protocol = "sfdenied"

    def _deny(self, *args, **kwargs):
        raise PermissionError(13, "Access Denied")

    cat_file = ls = info = _open = _deny


def test_io_failure_exit_75(tmp_path):
    fsspec.register_implementation("sfdenied", DeniedFileSystem, clobber=True)
    make_shards(tmp_path / "in", 1, 4)
    inputs = [str(tmp_path / "in" / "in-000000.tar"), "sfdenied://bucket/in-000001.tar"]
    job = ShardJob(identity, inputs, f"{tmp_path}/out/{{name}}.tar", io_retries=1, retry_backoff=0.01)
    job.prepare()
    code, log, _ = run(job.run_dir, 0, 2)
    assert code == contract.EXIT_RETRY == 75
    rd = RunDir(job.run_dir)
    assert rd.done_ids() == {0}
    assert rd.read_json("failed/000001.json")["kind"] == "io"


def test_on_error_raise_stops_the_whole_run_exit_78(tmp_path):
    url, _ = plan(tmp_path, 3, fn=explode, on_error="raise")
    code, log, _ = run(url, 0, 3)
    assert code == contract.EXIT_STOP == 78
    assert "task 1" not in log  # stopped at the first failure


def test_missing_plan_or_broken_job_exit_78(tmp_path):
    code, _, err = run(str(tmp_path / "nothing"), 0)
    assert code == 78 and "no plan.json" in err
    url, _ = plan(tmp_path, 1)
    (Path(url) / "job.pkl").write_bytes(b"\x80\x04garbage")
    code, _, err = run(url, 0)
    assert code == 78 and "cannot load the job" in err
    code, _, err = run(url, 5)
    assert code == 78 and "outside the plan" in err


class DownFileSystem(AbstractFileSystem):
    """A store that refuses every connection."""

    protocol = "sfdown"

    def _refuse(self, *args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    cat_file = ls = info = _open = _refuse


@pytest.mark.slow
def test_unreachable_run_dir_exit_75():
    fsspec.register_implementation("sfdown", DownFileSystem, clobber=True)
    code, _, err = run("sfdown://bucket/run", 0)
    assert code == contract.EXIT_RETRY and "unreachable" in err
    assert worker.finalize("sfdown://bucket/run", out=io.StringIO(), err=io.StringIO()) == contract.EXIT_RETRY


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_cli_unreachable_http_run_dir_exit_75(tmp_path):
    pytest.importorskip("aiohttp")
    url = f"http://127.0.0.1:{_closed_port()}/run"
    proc = subprocess.run([*shardflow_command(), "worker", "--run-dir", url, "--index", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75, proc.stderr


def plan_file(tmp: Path, shards: int, **overrides) -> tuple[str, Path]:
    """A job planned from a job file: its function travels by value, so a subprocess can load it."""
    from shardflow.job.jobfile import load_job

    make_shards(tmp / "in", shards, 4)
    out = tmp / "out"
    job = load_job(write_job_file(tmp), inputs=str(tmp / "in" / f"in-{{000000..{shards - 1:06d}}}.tar"),
                   outputs=f"{out}/{{name}}.tar", overrides=overrides)
    job.prepare()
    return job.run_dir, out


@pytest.mark.slow
def test_index_from_env_and_usage_errors(tmp_path):
    url, out = plan_file(tmp_path, 2)
    cmd = [*shardflow_command(), "worker", "--run-dir", url]
    env = {**os.environ, "JOB_COMPLETION_INDEX": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert RunDir(url).done_ids() == {1}
    env.pop("JOB_COMPLETION_INDEX")
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 2  # no index at all
    env["JOB_COMPLETION_INDEX"] = "x"
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 78


@pytest.mark.slow
def test_sigterm_discards_the_task_in_progress_and_exits_75(tmp_path):
    url, out = plan_file(tmp_path, 2, sleep=0.2)
    proc = subprocess.Popen([*shardflow_command(), "worker", "--run-dir", url, "--index", "0",
                             "--tasks-per-index", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, deadline = glob_temps(out, "in-000000.tar"), time.monotonic() + 60
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "stopped by SIGTERM" in err
    assert temp_files(out) == [] and not (out / "in-000000.tar").exists()
    rd = RunDir(url)
    assert rd.done_ids() == set() and rd.failed_ids() == set()  # an eviction is not a task failure
    code, _, _ = run(url, 0, 2)
    assert code == 0 and output_keys(out) == input_keys(2, 4)


def test_finalize_rebuilds_the_summary_from_markers(tmp_path):
    url, _ = plan(tmp_path, 3, truncate=2)
    run(url, 0, 2)
    out, err = io.StringIO(), io.StringIO()
    assert worker.finalize(url, out=out, err=err) == contract.EXIT_BAD_INPUT  # task 2 never ran
    summary = json.loads((Path(url) / "summary.json").read_text())
    assert summary["done"] == 2 and summary["tasks"] == 3 and not summary["ok"]
    run(url, 1, 2)
    assert worker.finalize(url, out=out, err=err) == contract.EXIT_BAD_INPUT
    summary = json.loads((Path(url) / "summary.json").read_text())
    assert summary["failed"]["2"]["kind"] == "input"
    assert summary["stats"]["samples_out"] == 8 and len(summary["shards"]) == 2
    (tmp_path / "in" / "in-000002.tar").unlink()
    make_shards(tmp_path / "in", 3, 4)  # the shard is fixed: rerun its index
    assert run(url, 1, 2)[0] == 0
    assert worker.finalize(url, out=out, err=err) == contract.EXIT_OK
    summary = json.loads((Path(url) / "summary.json").read_text())
    assert summary["ok"] and summary["done"] == 3 and summary["failed"] == {}


def stop_at_second_sample(sample):
    """identity, but the worker gets SIGTERM (a real one) when the shard is open: at the 2nd sample."""
    if sample["__key__"].endswith("k001"):
        os.kill(os.getpid(), signal.SIGTERM)
    return identity(sample)


def test_a_second_sigterm_during_the_cleanup_leaves_no_temp(tmp_path, monkeypatch):
    """A cancelled Slurm job's worker gets SIGTERM twice (slurmstepd's and the batch shell's, passed on).
    The second, landing in the first one's cleanup (here: as the temp is discarded), must not stop it:
    the temp stayed behind in 2 of 14 Slurm cancels before."""
    from shardflow.storage import publish

    url, out = plan(tmp_path, 2, fn=stop_at_second_sample)
    discard = publish.LocalReplace._discard

    def discard_under_a_second_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next call: inside the discard
        discard(self)
    monkeypatch.setattr(publish.LocalReplace, "_discard", discard_under_a_second_signal)
    code, _, err = run(url, 0, 2)
    assert code == contract.EXIT_RETRY and "stopped by SIGTERM" in err
    assert temp_files(out) == [] and RunDir(url).done_ids() == set()


def test_only_the_first_stop_signal_raises():
    raised = []
    with worker.stop_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler's exception
        except worker.Preempted as exc:
            raised.append(exc.signum)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while unwinding: ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert raised == [signal.SIGTERM]


@pytest.mark.parametrize("missing", [None, 500])
def test_the_pod_completing_a_span_merges_the_pods_summaries(tmp_path, missing):
    """After an Indexed Job of small chunks a report read one summary per pod (10,000 GETs at 100k tasks,
    pods of 10): the pod whose chunk completes a SPAN range now writes the range's summary from its pods'.
    With a pod's summary missing the range is left as it is (the report reads that pod's markers)."""
    from shardflow.rundir.stats import Stats
    from shardflow.rundir.summaries import SPAN, Block, summary_name, write_block
    from shardflow.shards.writer import TarWriter

    n = SPAN + 10
    job = ShardJob(identity, f"{tmp_path}/in/in-{{000000..{n - 1:06d}}}.tar", f"{tmp_path}/out/{{name}}.tar")
    job.prepare()
    rd = RunDir(job.run_dir)
    earlier = []
    for first in range(0, SPAN - 10, 10):  # the other pods of the range are done: their summaries
        entries = [{"url": f"{tmp_path}/out/in-{t:06d}.tar", "nsamples": 4, "nbytes": 10240, "sha256": f"{t:064x}"}
                   for t in range(first, first + 10)]
        earlier += entries
        if first != missing:
            write_block(rd, Block(first, first + 10, Stats(samples_in=40, samples_out=40), entries))
    for t in range(SPAN - 10, n):  # the last pods' inputs
        with TarWriter(f"{tmp_path}/in/in-{t:06d}.tar") as writer:
            for i in range(4):
                writer.write({"__key__": f"s{t}/k{i:03d}", "txt": b"x" * 100})
    assert run(job.run_dir, (SPAN - 10) // 10, 10)[0] == contract.EXIT_OK
    span = Path(job.run_dir) / summary_name(0, SPAN)
    if missing is not None:
        assert not span.exists()
        return
    merged = json.loads(span.read_text())
    last = RunDir(job.run_dir).read_json(summary_name(SPAN - 10, SPAN))["shards"]
    assert merged["shards"] == earlier + last and len(last) == 10
    assert merged["stats"]["samples_in"] == 40 * 99 + 40
    assert run(job.run_dir, SPAN // 10, 10)[0] == contract.EXIT_OK  # [1000, 1010): the pod's summary is the range's
    assert sorted(p.name for p in (Path(job.run_dir) / "summaries").iterdir() if p.name.startswith("000001")) == [
        summary_name(SPAN, n).rpartition("/")[2]]
