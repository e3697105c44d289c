"""ONE conformance suite for every backend (fsspec's abstract tests are the model): what a run promises
whatever runs its tasks. Each case is parametrized over the backends that can run here: serial,
processes, dask (the `dask_cluster` fixture: a scheduler and two worker processes) and ray (the
`ray_local` fixture: `ray.init(num_cpus=2)` in this process). A new backend adds one entry to BACKENDS
(and, when it needs a cluster, a branch in `runner` that requests its fixture).

- every sample is written exactly once, and no temp file is left;
- a rerun after a run that stopped part way finishes the rest: the finished tasks are not redone
  and still every sample is written exactly once;
- a bug in the job's function stops the run, and the report names the file and line that raised;
- a worker process that dies on one sample (a native crash, an out-of-memory kill) fails that task alone,
  naming its shard; the other tasks finish in the same run, each sample written exactly once.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shardflow.errors import FailureKind
from shardflow.job.shard_job import ShardJob
from tests.support.jobs import keys_in, make_shards, tars, temp_files

SHARDS, PER_SHARD = 4, 6
BACKENDS = [
    pytest.param("serial", id="serial"),
    pytest.param("processes", id="processes"),
    pytest.param("dask", id="dask", marks=pytest.mark.cluster),
    pytest.param("ray", id="ray", marks=pytest.mark.cluster),
    pytest.param("slurm", id="slurm", marks=[pytest.mark.cluster, pytest.mark.slow]),
]


@dataclass
class Runner:
    """A backend and the options that point it at its cluster."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def run(self, job: ShardJob) -> Any:
        return job.run(self.name, progress=False, **self.options)


@pytest.fixture(params=BACKENDS)
def runner(request) -> Runner:
    name = request.param
    if name == "processes":
        return Runner(name, {"workers": 2})
    if name == "dask":
        cluster = request.getfixturevalue("dask_cluster")
        request.getfixturevalue("dask_client")  # two live workers at the start
        return Runner(name, {"address": cluster.address})
    if name == "ray":
        request.getfixturevalue("ray_local")  # a run without an address uses this process's Ray
        return Runner(name)
    if name == "slurm":  # a real one-node Slurm; one array task runs the tasks in order (python -m: cwd importable)
        request.getfixturevalue("slurm_cluster").cancel_all()
        logs = request.getfixturevalue("tmp_path") / "slurm-logs"
        return Runner(name, {"shared_fs": True, "tasks_per_array_task": SHARDS, "poll": 0.3, "log_dir": str(logs),
                             "command": f"{sys.executable} -m shardflow"})
    return Runner(name)


def _inputs(tmp_path: Path) -> str:
    make_shards(tmp_path / "in", SHARDS, PER_SHARD)
    return str(tmp_path / "in" / "in-{000000..000003}.tar")


def _expected() -> set[str]:
    return {f"s{i:06d}" for i in range(SHARDS * PER_SHARD)}


def relabel(sample):
    """A plain 1:1 function: a txt member added (images are decoded and encoded again)."""
    sample["txt"] = sample["__key__"].encode()
    return sample


class StopWhileFlagged:
    """Fails the samples of one input shard while a flag file exists (a run that stops part way)."""

    def __init__(self, flag: str, shard: str) -> None:
        self.flag, self.shard = flag, shard

    def __call__(self, sample):
        if sample["__url__"].endswith(self.shard) and os.path.exists(self.flag):
            raise RuntimeError("the flag is up")
        sample["txt"] = b"ok"
        return sample


CRASH_KEY, CRASH_TASK = "s000008", 1  # the third sample of input shard 1


def crash_on_one_sample(sample):
    """Ends its process on one sample, every time: like a native crash or an OOM kill on one bad image."""
    if sample["__key__"] == CRASH_KEY:
        os._exit(3)
    sample["txt"] = b"ok"
    return sample


def broken(sample):
    return sample["no such member"]  # BUG_LINE: a user bug on every sample


def _no_temp_files(out: Path, wait: float = 15.0) -> None:
    """No temp file is left. Tasks still running when a run stops (cancelled on a cluster) abort
    theirs as they notice, which may come a moment after the driver returned: wait for that."""
    deadline = time.monotonic() + wait
    while temp_files(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert temp_files(out) == []


def _check_exactly_once(out: Path) -> None:
    counts = keys_in(tars(out))
    assert set(counts) == _expected()
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
    _no_temp_files(out)


def _job(tmp_path: Path, fn, **settings) -> ShardJob:
    """The suite's job: `fn` over the inputs, one output shard per task into tmp_path/out."""
    out = tmp_path / "out"
    return ShardJob(fn, _inputs(tmp_path), f"{out}/{{task:03d}}.tar", run_dir=str(out / "_run"), **settings)


def test_every_sample_is_written_exactly_once(runner, tmp_path):
    out = tmp_path / "out"
    job = _job(tmp_path, relabel)
    report = runner.run(job)
    assert report.ok, report
    assert report.done == SHARDS and report.stats.samples_out == SHARDS * PER_SHARD
    _check_exactly_once(out)


def test_a_rerun_after_a_stopped_run_finishes_the_rest_exactly_once(runner, tmp_path):
    out, flag = tmp_path / "out", tmp_path / "flag"
    flag.write_text("up")
    job = _job(tmp_path, StopWhileFlagged, fn_args=(str(flag), "in-000002.tar"), on_error="raise")
    first = runner.run(job)
    assert not first.ok and 2 in first.failed, first
    _no_temp_files(out)  # the failed task's partial shard was aborted, not left behind
    done_before = first.done
    flag.unlink()
    second = runner.run(job)
    assert second.ok, second
    # finished tasks are not redone (on a cluster a task still running when the run stopped may have
    # finished after it: done then too), and the failed one is
    assert done_before <= second.skipped < SHARDS
    _check_exactly_once(out)


def test_a_user_bug_stops_the_run_with_its_file_and_line(runner, tmp_path):
    out = tmp_path / "out"
    job = _job(tmp_path, broken)
    report = runner.run(job)
    assert report.failed, report
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "BUG_LINE" in text)
    kinds = {failure["kind"] for failure in report.failed.values()}
    assert kinds == {FailureKind.USER}, report.failed
    error = next(iter(report.failed.values()))["error"]
    assert f"{__file__}, line {line}" in error, error
    assert report.done == 0  # no task of a broken function counts as done
    _no_temp_files(out)


@pytest.mark.slow  # a pool (or a cluster) replaced twice: ~5 s on processes
def test_a_worker_that_dies_on_one_sample_fails_only_its_task(runner, tmp_path):
    if runner.name == "serial":
        pytest.skip("serial runs every task in the driver process: a sample that ends its process ends the run")
    options = runner.options
    if runner.name == "dask":  # the suite's cluster runs its workers without a nanny: a dead one is not replaced
        import dask

        options = {"workers": 2, "dashboard_address": ":0"}  # its LocalCluster: nannies restart dead workers
        settings = dask.config.set({"distributed.scheduler.allowed-failures": 1})
    else:
        from contextlib import nullcontext

        settings = nullcontext()
        if runner.name == "ray":
            options = {**options, "max_retries": 1}  # Ray's own retries of a task whose worker died
    out = tmp_path / "out"
    job = _job(tmp_path, crash_on_one_sample, io_retries=1)
    with settings:
        report = Runner(runner.name, options).run(job)
    assert set(report.failed) == {CRASH_TASK}, report
    failure = report.failed[CRASH_TASK]
    assert failure["kind"] == FailureKind.IO and "died" in failure["error"], failure
    assert f"in-{CRASH_TASK:06d}.tar" in failure["error"], failure  # the shard to look at
    assert report.done == SHARDS - 1  # the tasks in flight beside it finished too, in this run
    counts = keys_in(tars(out))
    crashed = {f"s{i:06d}" for i in range(CRASH_TASK * PER_SHARD, (CRASH_TASK + 1) * PER_SHARD)}
    assert set(counts) == _expected() - crashed and set(counts.values()) == {1}
    _no_temp_files(out)
