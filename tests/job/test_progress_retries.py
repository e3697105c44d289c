"""Issue 26 item 18: progress after retries. An attempt that fails with an I/O error after it reported
samples, then succeeds on a retry, must not count those samples twice ("1049/~1049")."""

from __future__ import annotations

import time

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

import shardflow as sf
from shardflow.job.progress import Progress
from shardflow.task.run_task import run_task
from tests.support.jobs import make_shards


class SecondPartFails(LocalFileSystem):
    """Local files behind `secondpart://`; the first open for writing of a rollover part `_001` fails,
    after the task already wrote (and reported) the samples of its part 0."""

    protocol = "secondpart"
    failed = False

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_mkdir", True)
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("secondpart://"):
            path = path[len("secondpart://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and "_001" in path and not SecondPartFails.failed:
            SecondPartFails.failed = True
            raise ConnectionError("injected network failure")
        return super()._open(path, mode, **kwargs)


@pytest.fixture()
def second_part_fails():
    fsspec.register_implementation("secondpart", SecondPartFails, clobber=True)
    SecondPartFails.failed = False
    yield
    SecondPartFails.failed = False


def slow_copy(sample):
    time.sleep(0.3)  # the samples of part 0 reach the progress callback (every 0.5 s) before part 1 fails
    return {"__key__": sample["__key__"], "jpg": sample["jpg"]}


def test_a_retried_attempt_does_not_count_its_samples_twice(tmp_path, second_part_fails):
    inputs = make_shards(tmp_path / "in", 1, 5)
    job = sf.ShardJob(slow_copy, inputs, f"secondpart://{tmp_path}/out/{{name}}.tar", maxcount=2,
                      run_dir=str(tmp_path / "run"), io_retries=2, retry_backoff=0.05)
    job.prepare()
    bar = Progress(1, 0, enabled=False, heartbeat=None)
    result = run_task(job.plan()[0], job, progress=bar.add_samples)
    bar.task_finished(result)
    assert SecondPartFails.failed and result.status == "done" and result.attempts == 2
    assert result.stats.samples_in == 5
    assert bar.samples == 5, bar.line()
    assert bar.line().startswith("shardflow: 5/~5 samples") or "5 samples," in bar.line()
