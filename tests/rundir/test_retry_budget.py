"""Issue 26 item 18: a run directory's store that stays down. The retry budget is stated, counted per
outage (not once per call: calls after the first failing one do not each get a fresh budget, which
added up to 414 s), and `--retry-budget` shortens it."""

from __future__ import annotations

import pytest
from fsspec.implementations.local import LocalFileSystem

from shardflow.storage.retrying_fs import RetryingFileSystem, StoreLostError, run_dir_retry
from tests.support.jobs import cli_env, make_shards


class Unreachable(LocalFileSystem):
    """A store whose every call fails as a dropped connection does; counts the calls."""

    calls = 0

    def cat_file(self, path, **kwargs):
        Unreachable.calls += 1
        raise ConnectionError("connection refused")


def test_the_budget_is_counted_per_outage_not_per_call():
    fs = RetryingFileSystem(Unreachable(), "s3://b/run", run_dir_retry(0.5))
    with pytest.raises(StoreLostError, match=r"retry budget 0.5 s \(--retry-budget\)"):
        fs.cat_file("/x")
    assert Unreachable.calls > 1
    Unreachable.calls = 0
    with pytest.raises(StoreLostError, match="lost the store of the run directory s3://b/run: unreachable for"):
        fs.cat_file("/y")  # the same outage: no fresh budget
    assert Unreachable.calls == 1


@pytest.mark.slow
def test_retry_budget_shortens_the_wait_for_a_store_that_stays_down(tmp_path):
    pytest.importorskip("s3fs")
    import subprocess
    import sys

    make_shards(tmp_path, 1, 4, name="a")
    env = {**cli_env(), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens there: the store is down
    done = subprocess.run([sys.executable, "-m", "shardflow.cli", "split", "a-000000.tar", "-o", "o/{part:04d}.tar",
                           "--maxcount", "2", "-b", "serial", "--run-dir", "s3://nobucket/rd", "--retry-budget", "2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2
    assert "lost the store of the run directory s3://nobucket/rd" in done.stderr
    assert "retry budget 2 s (--retry-budget)" in done.stderr and "Traceback" not in done.stderr


def test_listing_a_run_dir_folder_on_s3_is_retried_then_lost():
    """The folder listings of a run directory on S3 (storage.s3_listing's names, concurrent prefix listings
    of done/ and records/) are retried per outage like the filesystem's methods, then end in one line."""
    pytest.importorskip("s3fs")
    from shardflow.rundir.run_dir import RunDir

    options = {"key": "x", "secret": "y", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9",
                                                            "region_name": "us-east-1"},
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    run_dir = RunDir("s3://nobucket/rd", options, retry_budget=1.0)
    for folder, tasks in (("summaries", None), ("done", 5000)):
        with pytest.raises(StoreLostError, match=r"lost the store of the run directory s3://nobucket/rd: .* ls failed"):
            run_dir.list_names(folder, tasks=tasks)
