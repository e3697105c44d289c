"""Generated Jobs and Workflows run by a local pod runner: exactly-once through kills and bad input."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.samples import read_samples
from tests.support.k8s import (
    Kill,
    glob_temps,
    input_keys,
    make_shards,
    output_keys,
    run_indexed_job,
    run_workflow,
    temp_files,
    write_job_file,
)

SHARDS, PER_SHARD = 6, 4


@pytest.fixture
def setup(tmp_path: Path):
    def generate(kind: str, *extra: str, truncate: int | None = None) -> tuple[dict, Path]:
        make_shards(tmp_path / "in", SHARDS, PER_SHARD, truncate=truncate)
        job = write_job_file(tmp_path)
        out = tmp_path / "out"
        result = CliRunner().invoke(main, [
            kind, str(job), "--inputs", str(tmp_path / "in" / f"in-{{000000..{SHARDS - 1:06d}}}.tar"),
            "--outputs", f"{out}/{{name}}.tar", "--image", "shardflow:test", "--tasks-per-pod", "2",
            "--parallelism", "2", "--set", "sleep=0.05", "--pvc", f"data:{tmp_path}", *extra,
        ])
        assert result.exit_code == 0, result.output
        return yaml.safe_load(result.stdout), out

    return generate


def _check_exactly_once(out: Path, skip: set[int] = frozenset()) -> None:
    assert temp_files(out) == []
    assert output_keys(out) == input_keys(SHARDS, PER_SHARD, skip)
    run_dir = RunDir(str(out / "_shardflow"))
    assert run_dir.done_ids() == set(range(SHARDS)) - skip


@pytest.mark.slow
def test_indexed_job_survives_a_killed_pod_exactly_once(setup, tmp_path):
    manifest, out = setup("k8s")
    assert manifest["spec"]["completions"] == 3
    # index 1 runs tasks 2 and 3: SIGKILL it (a crash, OOM, a lost node) while it writes a shard
    kill = Kill(1, glob_temps(out, "in-00000[23].tar"), signal.SIGKILL)
    run = run_indexed_job(manifest, tmp_path / "pods", kills=[kill])
    assert kill.seen, "the pod was never killed mid-task"
    assert run.attempts[1] == [137, 0]  # counted against backoffLimitPerIndex, then rerun
    assert run.complete and run.succeeded == {0, 1, 2}
    _check_exactly_once(out)


@pytest.mark.slow
def test_evicted_pod_stops_cleanly_and_is_not_counted(setup, tmp_path):
    manifest, out = setup("k8s", "--retries", "0")  # a counted failure would fail the index
    seen = {}

    def on_exit(pod, code):
        if pod.index == 0 and pod.attempt == 0:
            seen["temps"] = [n for n in temp_files(out) if n.startswith((".in-000000.", ".in-000001."))]
            seen["finals"] = {p.name: len(list(read_samples(str(p)))) for p in out.glob("*.tar")}

    kill = Kill(0, glob_temps(out, "in-00000[01].tar"), signal.SIGTERM, disruption=True)
    run = run_indexed_job(manifest, tmp_path / "pods", kills=[kill], on_exit=on_exit)
    assert kill.seen
    assert run.attempts[0] == [75, 0], run.logs
    assert "stopped by SIGTERM" in run.logs[(0, 0)]
    assert run.ignored == 1 and run.complete
    # when the evicted pod exited: no temp file left, every visible shard whole
    assert seen["temps"] == []
    assert all(n == PER_SHARD for n in seen["finals"].values())
    _check_exactly_once(out)


@pytest.mark.slow
def test_truncated_shard_fails_its_index_only(setup, tmp_path):
    manifest, out = setup("k8s", truncate=3)
    run = run_indexed_job(manifest, tmp_path / "pods")
    assert run.attempts[1] == [65]  # FailIndex: not retried
    assert run.failed == {1} and run.succeeded == {0, 2}
    assert run.failed_job is None  # 1 failed index is within maxFailedIndexes
    _check_exactly_once(out, skip={3})
    failed = RunDir(str(out / "_shardflow")).read_json("failed/000003.json")
    assert failed["kind"] == "input" and "truncated" in failed["error"]


@pytest.mark.slow
def test_fatal_exit_fails_the_whole_job(setup, tmp_path):
    manifest, out = setup("k8s")
    (out / "_shardflow" / "job.json").unlink()  # no job-file source to rebuild from: the pickle is read
    (out / "_shardflow" / "job.pkl").write_bytes(b"not a pickle")
    run = run_indexed_job(manifest, tmp_path / "pods")
    assert run.failed_job and "exited 78" in run.failed_job
    assert sum(len(codes) for codes in run.attempts.values()) <= 2  # no retries after FailJob


@pytest.mark.slow
def test_argo_workflow_retries_a_killed_item_then_summarises(setup, tmp_path):
    workflow, out = setup("argo")
    kill = Kill(2, glob_temps(out, "in-00000[45].tar"), signal.SIGKILL)
    phase, runs = run_workflow(workflow, tmp_path / "pods", kills=[kill])
    assert kill.seen
    chunks = {r.item: r for r in runs if r.template == "chunk"}
    assert chunks["2"].exit_codes == [137, 0]
    assert phase == "Succeeded", [(r.template, r.item, r.exit_codes, r.logs) for r in runs]
    (summary_step,) = [r for r in runs if r.template == "finalize"]
    assert summary_step.exit_codes == [0]
    _check_exactly_once(out)
    summary = RunDir(str(out / "_shardflow")).read_json("summary.json")
    assert summary["ok"] and summary["done"] == SHARDS
    assert summary["stats"]["samples_out"] == SHARDS * PER_SHARD


@pytest.mark.slow
def test_argo_bad_input_is_not_retried_and_fails_the_workflow(setup, tmp_path):
    workflow, out = setup("argo", truncate=0)
    phase, runs = run_workflow(workflow, tmp_path / "pods")
    chunks = {r.item: r for r in runs if r.template == "chunk"}
    assert chunks["0"].exit_codes == [65]  # not retried
    assert chunks["1"].exit_codes == [0] and chunks["2"].exit_codes == [0]
    (summary_step,) = [r for r in runs if r.template == "finalize"]
    assert summary_step.exit_codes == [65]  # ran although a chunk failed (continueOn), reports it
    assert phase == "Failed"
    _check_exactly_once(out, skip={0})
    summary = RunDir(str(out / "_shardflow")).read_json("summary.json")
    assert not summary["ok"] and list(summary["failed"]) == ["0"]
