"""The conftest fixtures start real servers that really work: S3 (SeaweedFS) through s3fs, including
a kill and restart with the data kept; GCS (fake-gcs-server) through gcsfs; Dask with worker
processes of their own."""

from __future__ import annotations

import os
import time

import pytest

# ------------------------------------------------------------------------------------------------
# S3


def test_s3_put_get_and_restart(s3_server, s3_bucket):
    assert s3_bucket.startswith("s3://")
    fs = s3_server.filesystem()
    payload = os.urandom(3 * 2**20 + 17)
    fs.pipe_file(f"{s3_bucket}/a/b.bin", payload)
    fs.pipe_file(f"{s3_bucket}/a/c.txt", b"hello")
    assert fs.cat_file(f"{s3_bucket}/a/b.bin") == payload
    assert sorted(fs.ls(f"{s3_bucket}/a", detail=False)) == [f"{s3_bucket[5:]}/a/b.bin", f"{s3_bucket[5:]}/a/c.txt"]

    old_pid = s3_server.proc.pid
    s3_server.stop()
    assert not s3_server.running
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises: the server is gone
        s3_server.filesystem(config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2}).cat_file(
            f"{s3_bucket}/a/c.txt")
    s3_server.start()
    assert s3_server.running and s3_server.proc.pid != old_pid

    fs = s3_server.filesystem()  # a fresh client: same endpoint, same data
    assert fs.cat_file(f"{s3_bucket}/a/b.bin") == payload
    assert fs.cat_file(f"{s3_bucket}/a/c.txt") == b"hello"
    fs.pipe_file(f"{s3_bucket}/after-restart", b"x")
    assert fs.cat_file(f"{s3_bucket}/after-restart") == b"x"


def test_s3_credentials_are_enforced(s3_server, s3_bucket):
    s3_server.filesystem().pipe_file(f"{s3_bucket}/secret.txt", b"s")
    with pytest.raises((PermissionError, OSError)):
        s3_server.filesystem(secret="wrong-secret").cat_file(f"{s3_bucket}/secret.txt")


def test_s3_buckets_are_fresh(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    assert fs.ls(s3_bucket) == []
    assert s3_server.storage_options is not s3_server.storage_options  # fresh dict, safe to mutate


def test_s3_many_buckets(s3_server):
    """Every bucket is a SeaweedFS collection; the fixture's master.toml grows one volume per
    collection (not 7), so a long test session does not run out of volume slots."""
    import json
    import urllib.request

    def volumes():
        with urllib.request.urlopen(f"http://127.0.0.1:{s3_server.master_port}/dir/status") as resp:
            topo = json.load(resp)["Topology"]
        return sum(n["Volumes"] for dc in topo["DataCenters"] for r in dc["Racks"] for n in r["DataNodes"])

    fs = s3_server.filesystem()
    names = [f"many-{i}-{os.getpid()}-{time.monotonic_ns() % 10**6}" for i in range(8)]
    before = volumes()
    try:
        for name in names:
            fs.mkdir(name)
            fs.pipe_file(f"{name}/x.bin", os.urandom(1000))
        for name in names:
            assert len(fs.cat_file(f"{name}/x.bin")) == 1000
        assert volumes() - before <= len(names)
    finally:
        for name in names:
            s3_server.delete_bucket(name)


# ------------------------------------------------------------------------------------------------
# GCS


def test_gcs_put_get(gcs_server, gcs_bucket):
    import gcsfs

    assert gcs_bucket.startswith("gs://")
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **gcs_server.storage_options)
    payload = os.urandom(2 * 2**20 + 5)
    t0 = time.monotonic()
    fs.pipe_file(f"{gcs_bucket}/d/x.bin", payload)
    with fs.open(f"{gcs_bucket}/d/y.txt", "wb") as f:
        f.write(b"streamed")
    assert fs.cat_file(f"{gcs_bucket}/d/x.bin") == payload
    assert fs.cat_file(f"{gcs_bucket}/d/y.txt") == b"streamed"
    assert sorted(fs.ls(f"{gcs_bucket}/d", detail=False)) == [f"{gcs_bucket[5:]}/d/x.bin", f"{gcs_bucket[5:]}/d/y.txt"]
    with fs.open(f"{gcs_bucket}/d/x.bin", "rb", block_size=2**20) as f:
        f.seek(2**20)
        assert f.read(100) == payload[2**20:2**20 + 100]
    assert time.monotonic() - t0 < 30  # no per-bucket 60 s hang (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT)


def test_gcs_restart_keeps_data(gcs_server, gcs_bucket):
    fs = gcs_server.filesystem()
    fs.pipe_file(f"{gcs_bucket}/k", b"kept")
    gcs_server.stop()
    gcs_server.start()
    assert gcs_server.filesystem().cat_file(f"{gcs_bucket}/k") == b"kept"


# ------------------------------------------------------------------------------------------------
# Dask


def test_dask_runs_in_other_processes(dask_cluster, dask_client):
    assert dask_cluster.address.startswith("tcp://127.0.0.1:")
    assert len(dask_cluster.worker_procs) == 2
    assert dask_client.submit(lambda x: x + 1, 1).result(timeout=60) == 2
    pid = dask_client.submit(os.getpid, pure=False).result(timeout=60)
    assert pid != os.getpid()
    assert pid in {p.pid for p in dask_cluster.worker_procs}  # --no-nanny: the Popen is the worker
    pids = set(dask_client.run(os.getpid).values())
    assert pids == {p.pid for p in dask_cluster.worker_procs}


def test_dask_worker_killed_and_replaced(dask_cluster, dask_client):
    victim = dask_cluster.kill_worker(0)
    assert victim.poll() is not None
    # the remaining worker still computes
    assert dask_client.submit(lambda x: x * 3, 5, pure=False).result(timeout=60) == 15
    new = dask_cluster.start_worker()
    assert new.poll() is None
    dask_cluster.ensure_workers(2)
    assert len(dask_cluster.worker_procs) == 2 and victim not in dask_cluster.worker_procs
    assert set(dask_client.run(os.getpid).values()) == {p.pid for p in dask_cluster.worker_procs}


def test_dask_functions_from_test_modules_import_on_workers(dask_client):
    assert dask_client.submit(_module_level, 4).result(timeout=60) == 16


def _module_level(x):
    return x * x
