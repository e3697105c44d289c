"""Issue 12, faults: a store lost mid-run, a local input rewritten while read, a full disk, wrong
credentials with a glob, a Dask scheduler without workers, an HTTP server without Range support."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shardflow.errors import ShardIOError
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.storage.local_files import ObjectChangedError, open_write_named
from shardflow.storage.retry import RetryPolicy
from shardflow.storage.retrying_fs import StoreLostError
from shardflow.storage.schemes import open_read
from shardflow.storage.specs import expand
from tests.support.http_server import serve_directory
from tests.support.jobs import cli, cli_env, make_shards, spec, write_job

COPY_JOB = """
    def process(sample):
        return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
"""


def big_shard(path: Path, count: int, size: int) -> list[str]:
    keys = [f"k{i:04d}" for i in range(count)]
    with TarWriter(str(path)) as writer:
        for key in keys:
            writer.write({"__key__": key, "bin": os.urandom(size)})
    return keys


# -- 14: the store of the run directory goes away -----------------------------------------------------


def _restart_later(server, delay: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), server.start()), daemon=True)
    thread.start()
    return thread


def test_run_dir_io_is_retried_while_the_store_is_down(tmp_path, s3_server, s3_bucket):
    make_shards(tmp_path / "in", 2, 3)
    job = write_job(tmp_path, COPY_JOB)
    # botocore's own retries (a few seconds) would hide an outage this short: one attempt each, so
    # what keeps the driver alive is shardflow's retry policy for the run directory
    env = {**cli_env(), **s3_server.env, "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}
    args = [sys.executable, "-m", "shardflow.cli", "run", str(job), "--inputs", spec(tmp_path / "in", "in", 2),
            "--outputs", f"{s3_bucket}/out/{{name}}.tar", "-b", "serial"]
    s3_server.stop()  # the driver starts while the store is away: its first run-dir reads must wait
    restart = _restart_later(s3_server, 3.0)
    try:
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    finally:
        restart.join(120)
        s3_server.ensure_running()
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr
    status = subprocess.run([sys.executable, "-m", "shardflow.cli", "status", f"{s3_bucket}/out/_shardflow"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert "2 done" in status.stdout, status.stdout + status.stderr


def test_a_store_that_stays_away_is_one_clean_message(s3_server, s3_bucket):
    run_dir = RunDir(f"{s3_bucket}/run", s3_server.storage_options)
    run_dir.write_json("plan.json", {"tasks": []})
    run_dir.fs.retry = RetryPolicy(attempts=3, base_delay=0.05, deadline=10)
    s3_server.stop()
    try:
        with pytest.raises(StoreLostError) as info:
            run_dir.read_json("plan.json")
    finally:
        s3_server.start()
    text = str(info.value)
    assert "lost the store of the run directory" in text and "rerun the same command to resume" in text
    # the policy's first limit ends it: 3 attempts, or the 10 s budget when a loaded machine's connection
    # attempts to a stopped server are slow (CI once gave "failed 2 times")
    attempts = re.search(r"cat_file failed (\d+) times", text)
    assert attempts is not None and 1 <= int(attempts.group(1)) <= 3, text
    assert "unreachable for" in text and "retry budget 10 s" in text
    assert run_dir.read_json("plan.json") == {"tasks": []}  # the data was intact
    with pytest.raises(FileNotFoundError):  # a missing file is an answer, not retried
        run_dir.read_json("nothing.json")


# -- 15: a local input rewritten while it is read -------------------------------------------------------


def test_a_local_input_overwritten_during_the_read_fails_the_read(tmp_path):
    path = tmp_path / "a.tar"
    keys = big_shard(path, 6, 1 << 20)  # several 1 MiB buffers: reads continue after the change
    samples = read_samples(str(path))
    next(samples)
    other = tmp_path / "b.tar"
    big_shard(other, 6, 1 << 20)
    path.write_bytes(other.read_bytes())  # same inode, new bytes: a read now would mix two versions
    with pytest.raises(ObjectChangedError, match="local file overwritten while it was being read"):
        list(samples)
    # renamed over (an atomic publish): the open file is read whole in the version opened
    samples = read_samples(str(path))
    first = next(samples)
    replacement = tmp_path / "c.tar"
    big_shard(replacement, 6, 1 << 20)
    os.replace(replacement, path)
    assert [first["__key__"]] + [s["__key__"] for s in samples] == keys


def test_a_local_input_grown_after_its_last_byte_was_read_still_fails_the_read(tmp_path):
    """Reads stop at the size pinned at open (no 1 MiB allocation for a 2 KB shard's last, empty
    read), and that end still checks the file: one appended to meanwhile is not taken as complete."""
    from shardflow.storage.local_files import open_read_pinned

    path = tmp_path / "small.tar"
    with TarWriter(str(path)) as writer:
        writer.write({"__key__": "k", "txt": b"x"})
    size = path.stat().st_size
    with open_read_pinned(str(path), str(path)) as f:
        assert len(f.read(1 << 20)) == size
        assert f.read(1 << 20) == b""  # the pinned end, the file unchanged
    with open_read_pinned(str(path), str(path)) as f:
        assert len(f.read(1 << 20)) == size
        with open(path, "ab") as grow:
            grow.write(b"\0" * 512)
        with pytest.raises(ObjectChangedError, match="local file overwritten while it was being read"):
            f.read(1 << 20)


def test_a_task_whose_input_changes_fails_as_io(tmp_path):
    shard = tmp_path / "in" / "in-000000.tar"
    shard.parent.mkdir()
    big_shard(shard, 6, 1 << 20)
    job = write_job(tmp_path, f"""
        import os, shutil
        def process(sample):
            if sample["__key__"] == "k0000":
                shutil.copyfile({str(shard)!r} + ".new", {str(shard)!r})  # rewritten under the reader
            return sample
    """)
    shutil.copyfile(shard, str(shard) + ".new")
    with open(str(shard) + ".new", "r+b") as f:  # same size, other bytes in the second sample's data
        f.seek(3 << 20)
        f.write(b"\1" * 1000)
    out = tmp_path / "out"
    done = cli("run", job, "--inputs", shard, "--outputs", str(out / "{name}.tar"), "--set", "io_retries=0",
               "-b", "serial")
    assert done.returncode == 1, done.stderr
    failed = json.loads((out / "_shardflow" / "failed" / "000000.json").read_text())
    assert failed["kind"] == "io" and "while it was being read" in failed["error"]
    assert not (out / "in-000000.tar").exists()


# -- 17: a full disk names the file and the task -------------------------------------------------------


def test_a_full_device_names_the_file():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(OSError, match=r"No space left on device: '/out/shard-000001.tar'"):
        with open_write_named("/dev/full", "/out/shard-000001.tar") as f:
            f.write(b"x" * (2 << 20))


def _can_mount_tmpfs(mountpoint: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mountpoint}"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
def test_disk_full_beside_the_outputs_names_the_file_and_the_task(tmp_path):
    """A real full filesystem: a 400 KiB tmpfs in a private mount namespace (unshare -rm)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _can_mount_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    make_shards(tmp_path / "in", 3, 10, size=(64, 64))
    job = write_job(tmp_path, """
        def process(sample):
            return {"__key__": sample["__key__"], "jpg": sample["jpg"], "bin": b"x" * 30000}
    """)
    command = (f"mount -t tmpfs -o size=400k tmpfs {mnt} && exec {sys.executable} -m shardflow.cli run {job} "
               f"--inputs '{spec(tmp_path / 'in', 'in', 3)}' --outputs '{mnt}/out/{{name}}.tar' -b serial")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, env=cli_env(),
                          timeout=300)
    text = done.stdout + done.stderr
    assert "Traceback" not in text
    assert done.returncode in (1, 2), text
    assert "No space left on device: '" in text  # the file is named...
    assert "task " in text and f"{mnt}/out/" in text  # ...and the task
    assert "No space left on device\n" not in text


# -- 18: wrong credentials with a glob ----------------------------------------------------------------


def test_wrong_credentials_with_a_glob_say_access_denied(s3_server, s3_bucket):
    s3_server.filesystem().pipe(f"{s3_bucket[5:]}/d/in-000000.tar", b"x" * 10)
    wrong = {"key": s3_server.key, "secret": "not-the-secret",
             "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    for pattern in ("/d/in-*.tar", "/*/in-*.tar"):
        with pytest.raises(ShardIOError) as info:
            expand(s3_bucket + pattern, wrong)
        assert "access denied" in str(info.value) and "matched no shards" not in str(info.value)
        assert "not-the-secret" not in str(info.value)


# -- 20: an HTTP server without Range support -----------------------------------------------------------


def test_http_shard_over_8_mib_without_range_support(tmp_path):
    keys = big_shard(tmp_path / "big.tar", 20, 1 << 20)  # 20 MiB: three 8 MiB blocks
    stats: dict = {}
    with serve_directory(tmp_path, stats=stats) as base:  # http.server ignores Range, like `python -m http.server`
        got = [(s["__key__"], len(s["bin"])) for s in read_samples(f"{base}/big.tar")]
        assert stats["gets"] == 1  # one streamed GET, not the whole body once per block
        with open_read(f"{base}/big.tar", block_size=1 << 20) as stream:  # a seek backwards: a new GET
            stream.seek(5 << 20)
            middle = stream.read(100)
            stream.seek(1000)
            start = stream.read(100)
    assert got == [(k, 1 << 20) for k in keys]
    data = (tmp_path / "big.tar").read_bytes()
    assert (middle, start) == (data[5 << 20:(5 << 20) + 100], data[1000:1100])


def test_http_small_shards_still_read_in_ranges(tmp_path):
    keys = big_shard(tmp_path / "small.tar", 3, 1000)
    with serve_directory(tmp_path) as base:
        assert [s["__key__"] for s in read_samples(f"{base}/small.tar")] == keys




# -- 19: a Dask scheduler without workers ----------------------------------------------------------------


@pytest.fixture()
def lonely_scheduler(tmp_path):
    pytest.importorskip("distributed")
    from tests.support.dask_cluster import DaskCluster, _dask_command

    cluster = DaskCluster(tmp_path / "dask", _dask_command())
    cluster.workdir.mkdir()
    cluster.start_scheduler()
    yield cluster
    cluster.close()


@pytest.mark.cluster
def test_dask_scheduler_without_workers_is_reported_and_limited(tmp_path, lonely_scheduler):
    make_shards(tmp_path / "in", 1, 2)
    job = write_job(tmp_path, COPY_JOB)
    args = ["run", job, "--inputs", tmp_path / "in" / "in-000000.tar", "--outputs",
            str(tmp_path / "out" / "{name}.tar"), "-b", "dask", "--address", lonely_scheduler.address]
    started = time.monotonic()
    done = cli(*args, "--wait-workers", "6", timeout=120)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 60
    assert f"the Dask scheduler at {lonely_scheduler.address} has no workers; waited 5 s so far" in done.stderr
    assert f"no Dask worker joined the scheduler at {lonely_scheduler.address} in 6 s" in done.stderr
    assert "Traceback" not in done.stderr
    # without a limit it waits, and goes on as soon as a worker joins
    lonely_scheduler.start_worker(wait=False)
    joined = cli(*args, timeout=180)
    assert joined.returncode == 0, joined.stderr
    assert cli("run", job, "--inputs", "x", "--outputs", "y", "--wait-workers", "3").returncode == 2
