"""Unfinished multipart uploads of a killed task, aborted when the task runs again (storage.stale_uploads).

Against the real S3 server of the `s3_server` fixture (SeaweedFS): a job whose two tasks stream
rollover parts to S3 is SIGKILLed while both have a multipart upload open (the test waits until
ListMultipartUploads shows them), then rerun: no upload stays open and the outputs are byte for byte
those of a clean run. In process: two listings of the output folder for a whole run of many tasks
(the first task's, the run end's), and only the run's own keys aborted (a neighbour's or another
folder's upload stays).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from tests.support.storage_samples import write_shard

pytest.importorskip("s3fs")

MB = 2**20
NSHARDS, PER_SHARD, SAMPLE_BYTES = 2, 8, 2 * MB  # maxcount 4: parts of 8 MiB, the second one held open
HELD_AT = 7  # with the hold on, the 8th sample of each input waits: part 001 has 6 MiB in its upload

JOB_DRIVER = '''
import json, os, sys, time
import shardflow as sf

def copy(sample):
    import shardflow.storage.upload as upload
    upload.DEFAULT_UPLOAD_BLOCK_SIZE = 5 * 2**20  # S3's smallest part: a multipart upload from 5 MiB
    if os.environ.get("SF_TEST_HOLD") and sample["__key__"].endswith("x%03d" % {held}):
        time.sleep(3600)  # killed here, with the part's multipart upload open
    return {{k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}}

if __name__ == "__main__":
    spec = json.loads(os.environ["SF_JOB_SPEC"])
    job = sf.ShardJob(copy, inputs=spec["inputs"], outputs=spec["outputs"], run_dir=spec["run_dir"],
                      storage_options=json.loads(os.environ["SF_JOB_OPTIONS"]), maxcount=4)
    report = job.run("processes", workers=2)
    print("RESULT", json.dumps({{"ok": report.ok, "done": report.done}}), flush=True)
'''.format(held=HELD_AT)


def _open_uploads(s3_server, bucket_url: str) -> list[str]:
    bucket = bucket_url.removeprefix("s3://")
    answer = s3_server.boto3_client().list_multipart_uploads(Bucket=bucket)
    return sorted(u["Key"] for u in answer.get("Uploads") or ())


def _inputs(s3_server, bucket_url: str) -> str:
    rng = random.Random(7)
    for s in range(NSHARDS):
        write_shard(f"{bucket_url}/src/in-{s:03d}.tar",
                    [{"__key__": f"s{s}x{i:03d}", "bin": rng.randbytes(SAMPLE_BYTES)} for i in range(PER_SHARD)],
                    s3_server.storage_options)
    return f"{bucket_url}/src/in-{{000..{NSHARDS - 1:03d}}}.tar"


def _driver(tmp_path: Path, s3_server, inputs: str, folder: str, *, hold: bool) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(JOB_DRIVER)
    spec = {"inputs": inputs, "outputs": f"{folder}/{{name}}-{{part:03d}}.tar", "run_dir": f"{folder}/_run"}
    env = {**os.environ, "SF_JOB_SPEC": json.dumps(spec), "SF_JOB_OPTIONS": json.dumps(s3_server.storage_options),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("SF_TEST_HOLD", None)
    if hold:
        env["SF_TEST_HOLD"] = "1"
    return subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and '"ok": true' in out, err[-3000:]


def _shards(fs, folder: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {p.rpartition("/")[2]: fs.cat_file(p) for p in fs.find(folder) if "/_run/" not in p}


def test_task_killed_mid_upload_leaves_no_open_upload_after_rerun(s3_server, s3_bucket, tmp_path):
    pytest.importorskip("shardflow.job.shard_job")
    inputs = _inputs(s3_server, s3_bucket)
    folder = f"{s3_bucket}/mp"
    proc = _driver(tmp_path, s3_server, inputs, folder, hold=True)
    expected_open = [f"mp/in-{s:03d}-001.tar" for s in range(NSHARDS)]
    deadline = time.monotonic() + 180
    try:
        while _open_uploads(s3_server, s3_bucket) != expected_open:  # both tasks are mid-upload
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no upload opened: {_open_uploads(s3_server, s3_bucket)}"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, each inside an upload
        proc.communicate(timeout=30)
    assert _open_uploads(s3_server, s3_bucket) == expected_open  # what the killed attempts left

    _finish(_driver(tmp_path, s3_server, inputs, folder, hold=False))
    assert _open_uploads(s3_server, s3_bucket) == []

    _finish(_driver(tmp_path, s3_server, inputs, f"{s3_bucket}/clean", hold=False))
    fs = s3_server.filesystem()
    resumed, clean = _shards(fs, folder), _shards(fs, f"{s3_bucket}/clean")
    assert sorted(resumed) == [f"in-{s:03d}-{p:03d}.tar" for s in range(NSHARDS) for p in range(2)]
    assert resumed == clean


class _CopyAfterAKill:
    """Copies samples; its first call opens an upload of task 7's key, as a worker killed mid-task 7
    after this process listed the folder would leave it (the task then runs again here)."""

    def __init__(self, s3_server, bucket: str, flag: Path) -> None:
        self.endpoint, self.key, self.secret = s3_server.endpoint_url, s3_server.key, s3_server.secret
        self.bucket, self.flag = bucket, str(flag)

    def __call__(self, sample):
        if not os.path.exists(self.flag):
            import boto3

            client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                                  aws_secret_access_key=self.secret, region_name="us-east-1")
            client.create_multipart_upload(Bucket=self.bucket, Key="out/in-007-000.tar")
            Path(self.flag).touch()
        return {"__key__": sample["__key__"], "bin": sample["bin"]}


def test_two_listings_per_run_and_only_own_keys_aborted(s3_server, s3_bucket, tmp_path, monkeypatch):
    """Twelve tasks in one process: one ListMultipartUploads of the output folder at the first task (the
    killed attempt's upload of task 3's rollover part aborted) and one when the run ends (the upload
    left after that listing aborted); every other upload is left alone."""
    shard_job = pytest.importorskip("shardflow.job.shard_job")
    options = s3_server.storage_options
    for s in range(12):
        write_shard(f"{s3_bucket}/src/in-{s:03d}.tar", [{"__key__": f"k{s}", "bin": b"x" * 100}], options)
    client = s3_server.boto3_client()
    bucket = s3_bucket.removeprefix("s3://")
    planted = ["out/in-003-002.tar",  # task 3's third rollover part: a killed attempt's
               # no task's keys (near misses of task 3's and a task that does not exist), another folder
               "out/in-0003-002.tar", "out/in-003-0002.tar", "out/in-003-002.tar.bak", "out/in-012-000.tar",
               "elsewhere/in-003-000.tar"]
    for key in planted:
        client.create_multipart_upload(Bucket=bucket, Key=key)

    shared = fsspec.filesystem("s3", **options)  # the cached instance the run's tasks use
    calls: list[str] = []
    original = shared._call_s3

    async def counting(method, *args, **kwargs):
        calls.append(method)
        return await original(method, *args, **kwargs)

    monkeypatch.setattr(shared, "_call_s3", counting)
    fn = _CopyAfterAKill(s3_server, bucket, tmp_path / "planted")
    job = shard_job.ShardJob(fn, inputs=f"{s3_bucket}/src/in-{{000..011}}.tar",
                             outputs=f"{s3_bucket}/out/{{name}}-{{part:03d}}.tar", run_dir=str(tmp_path / "run"),
                             storage_options=options)
    report = job.run("serial")
    assert report.ok and report.done == 12
    # task 0 lists, task 3 aborts its own at its start; the run's end lists again and aborts task 7's
    assert [c for c in calls if c.endswith("_uploads") or c.startswith("abort")] == [
        "list_multipart_uploads", "abort_multipart_upload", "list_multipart_uploads", "abort_multipart_upload"]
    left = sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads") or ())
    assert left == sorted(planted[1:])
