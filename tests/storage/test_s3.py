"""S3-specific behaviour against a real S3 server on 127.0.0.1 (the `s3_server` fixture).

What every store must do (round trips, failed and dropped writes publishing nothing, a read across a
server restart, an object replaced during a read, globs) is the storage contract, run on S3 among
others in test_contract.py. Here: per-prefix options, open_write's multipart upload dropped
without close, a server that stays down, an object deleted during a read, one server-side-prefix
listing per glob, credentials kept out of every message, and jobs over S3 killed and resumed.
"""

from __future__ import annotations

import gc
import os
import time
import traceback

import fsspec
import pytest

from shardflow.errors import ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.storage.retry import RetryPolicy
from shardflow.storage.schemes import open_read, open_write
from shardflow.storage.specs import expand
from tests.support.storage_samples import make_samples, strip_url, write_shard

pytest.importorskip("s3fs")

MB = 2**20


def _fs(s3_server):
    return fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options)


# ------------------------------------------------------------------------------------------------
# options and uploads


def test_per_prefix_storage_options(s3_server, s3_bucket):
    good = s3_server.storage_options
    options = {
        "s3://": {**good, "secret": "wrong-secret-for-everything-else"},
        s3_bucket: good,
    }
    url = f"{s3_bucket}/prefix/a.tar"
    write_shard(url, make_samples(3, 100), options)
    assert len(list(read_samples(url, storage_options=options))) == 3
    assert expand(f"{s3_bucket}/prefix/*.tar", options) == [url]


def test_open_write_dropped_upload_is_not_published(s3_server, s3_bucket):
    url = f"{s3_bucket}/gc/open_write.bin"
    f = open_write(url, s3_server.storage_options)
    f.write(os.urandom(1000))
    del f
    gc.collect()
    assert not _fs(s3_server).exists(url)
    g = open_write(url, s3_server.storage_options)
    g.write(b"x" * 10)
    g.close()
    assert _fs(s3_server).cat_file(url) == b"x" * 10


# ------------------------------------------------------------------------------------------------
# transient faults


def _big_shard(s3_server, s3_bucket, name, n=48, size=500_000):
    samples = make_samples(n, size, seed=7)
    url = f"{s3_bucket}/faults/{name}"
    write_shard(url, samples, s3_server.storage_options)
    return url, samples


def test_read_fails_cleanly_when_server_stays_down(s3_server, s3_bucket):
    url, samples = _big_shard(s3_server, s3_bucket, name="down.tar")
    # botocore's own retries (5 attempts, ~12 s per call against a dead port) off to keep this short
    options = {**s3_server.storage_options, "config_kwargs": {"retries": {"max_attempts": 1}}}
    stream = open_read(url, options, block_size=1 * MB, readahead=0,
                       retry=RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.1, deadline=30))
    got = []
    try:
        it = read_samples(stream, url)
        got.append(next(it))
        s3_server.stop()
        with pytest.raises(ShardIOError) as info:
            for sample in it:
                got.append(sample)
    finally:
        s3_server.start()
        stream.close()
    message = str(info.value)
    assert url in message and "attempts" in message
    assert s3_server.secret not in message
    assert len(got) < len(samples)
    assert all(strip_url(g) == s for g, s in zip(got, samples))  # what was yielded was whole


def test_object_deleted_during_read_is_detected(s3_server, s3_bucket):
    options = s3_server.storage_options
    url, _ = _big_shard(s3_server, s3_bucket, name="deleted.tar", n=10, size=300_000)
    with open_read(url, options, block_size=512 * 1024, readahead=0) as stream:
        it = read_samples(stream, url)
        next(it)
        _fs(s3_server).rm(url)
        with pytest.raises(ShardIOError) as info:
            list(it)
    assert url in str(info.value)


# ------------------------------------------------------------------------------------------------
# globs


def test_glob_over_bucket_lists_once(s3_server, s3_bucket, monkeypatch):
    options = s3_server.storage_options
    fs = _fs(s3_server)
    for name in ["train-000.tar", "train-001.tar", "train-002.tar", "val-000.tar", "train-x/inner.tar",
                 "other/train-009.tar"]:
        fs.pipe_file(f"{s3_bucket}/ds/{name}", b"x")
    shared = fsspec.filesystem("s3", **options)  # the cached instance expand() will use
    calls = []
    original = shared._call_s3

    async def counting(method, *args, **kwargs):
        calls.append((method, kwargs.get("Prefix")))
        return await original(method, *args, **kwargs)

    monkeypatch.setattr(shared, "_call_s3", counting)
    got = expand(f"{s3_bucket}/ds/train-*.tar", options)
    assert got == [f"{s3_bucket}/ds/train-{i:03d}.tar" for i in range(3)]
    lists = [c for c in calls if c[0].startswith("list_objects")]
    assert len(lists) == 1 and lists[0][1] == "ds/train-"  # one listing, server-side prefix
    calls.clear()
    assert expand([f"{s3_bucket}/ds/val-*.tar", f"{s3_bucket}/ds/train-00{{1..2}}.tar"], options) == [
        f"{s3_bucket}/ds/val-000.tar", f"{s3_bucket}/ds/train-001.tar", f"{s3_bucket}/ds/train-002.tar"]
    assert len([c for c in calls if c[0].startswith("list_objects")]) == 1
    with pytest.raises(ShardIOError, match="matched no shards"):
        expand(f"{s3_bucket}/ds/nothing-*.tar", options)


# ------------------------------------------------------------------------------------------------
# credentials never in messages


def _all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def test_bad_credentials_errors_name_url_not_secret(s3_server, s3_bucket):
    url = f"{s3_bucket}/creds/a.tar"
    write_shard(url, make_samples(2, 100), s3_server.storage_options)
    endpoint = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"}}
    wrong_secret = {"key": s3_server.key, "secret": "WRONGsecretVALUE-0123456789", **endpoint}
    wrong_key = {"key": "AKIADOESNOTEXIST42", "secret": "ANOTHERsecretVALUE-987654", **endpoint}
    for options in (wrong_secret, wrong_key):
        fsspec.filesystem("s3", **options).invalidate_cache()
        with pytest.raises(ShardIOError) as info:
            with open_read(url, options) as stream:
                stream.read()
        assert url in str(info.value)
        assert options["secret"] not in _all_text(info.value)  # not even in the chained causes
        assert options["key"] not in str(info.value)
        with pytest.raises(ShardIOError) as info:
            with TarWriter(f"{s3_bucket}/creds/out.tar", storage_options=options) as writer:
                writer.write(make_samples(1, 10)[0])
        assert f"{s3_bucket}/creds/out.tar" in str(info.value)
        assert options["secret"] not in str(info.value) and options["key"] not in str(info.value)
        with pytest.raises(ShardIOError) as info:
            expand(f"{s3_bucket}/creds/*.tar", options)
        assert options["secret"] not in str(info.value) and options["key"] not in str(info.value)


# ------------------------------------------------------------------------------------------------
# job level: a ShardJob over object storage, SIGKILLed mid-way and resumed


JOB_DRIVER = '''
import json, os, sys, time
import shardflow as sf

def slow_copy(sample):
    time.sleep(0.03)
    return {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}

if __name__ == "__main__":
    spec = json.loads(os.environ["SF_JOB_SPEC"])          # urls only
    options = json.loads(os.environ["SF_JOB_OPTIONS"])    # credentials: in the environment, never argv
    job = sf.ShardJob(slow_copy, inputs=spec["inputs"], outputs=spec["outputs"], run_dir=spec["run_dir"],
                      storage_options=options, maxcount=5)
    report = job.run(spec["backend"], **({"workers": 2} if spec["backend"] == "processes" else {}))
    print("RESULT", json.dumps({"ok": report.ok, "done": report.done, "tasks": report.tasks}), flush=True)
'''
NSHARDS, PER_SHARD = 8, 12


def _job_inputs(fs_options, prefix):
    urls_ = []
    for s in range(NSHARDS):
        url = f"{prefix}/in-{s:03d}.tar"
        write_shard(url, [{"__key__": f"s{s:02d}x{i:03d}", "bin": os.urandom(2000), "cls": b"%d" % i}
                           for i in range(PER_SHARD)], fs_options)
        urls_.append(url)
    return f"{prefix}/in-{{000..{NSHARDS - 1:03d}}}.tar"


def _run_driver(tmp_path, spec, options, env_extra, kill_after_markers=None, s3fs_=None):
    import json
    import signal
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(JOB_DRIVER)
    env = {**os.environ, **env_extra, "SF_JOB_SPEC": json.dumps(spec), "SF_JOB_OPTIONS": json.dumps(options),
           "PYTHONPATH": os.pathsep.join([str(__import__("pathlib").Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    if kill_after_markers is None:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        return out, err
    done_dir = spec["run_dir"] + "/done"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        try:
            s3fs_.invalidate_cache()
            markers = [p for p in s3fs_.ls(done_dir) if p.endswith(".json")]
        except FileNotFoundError:
            markers = []
        if len(markers) >= kill_after_markers:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its worker processes, mid-task
    proc.communicate(timeout=30)
    return None


def _check_outputs_and_secrets(fs, out_prefix, run_dir, secrets):
    from collections import Counter

    from shardflow.storage.atomic import TEMP_MARK

    fs.invalidate_cache()
    outputs = sorted(p for p in fs.find(out_prefix) if p.endswith(".tar") and "/_run/" not in p)
    assert not [p for p in fs.find(out_prefix) if TEMP_MARK in p]  # no temp objects anywhere
    counts = Counter(s["__key__"] for p in outputs for s in read_samples(fs.open(p, "rb"), p))
    expected = {f"s{s:02d}x{i:03d}" for s in range(NSHARDS) for i in range(PER_SHARD)}
    assert set(counts) == expected and set(counts.values()) == {1}
    written = fs.find(out_prefix) + fs.find(run_dir)
    assert any(p.endswith(".json") for p in fs.find(run_dir))
    for path in set(written):
        data = fs.cat_file(path)
        for secret in secrets:
            assert secret.encode() not in data, f"credential found in {path}"


@pytest.mark.parametrize("backend", ["processes"])
def test_job_s3_to_s3_killed_and_resumed(s3_server, s3_bucket, tmp_path, backend):
    pytest.importorskip("shardflow.job.shard_job")
    options = s3_server.storage_options  # literal credentials, as a user passes them
    inputs = _job_inputs(options, f"{s3_bucket}/src")
    spec = {"inputs": inputs, "outputs": f"{s3_bucket}/out/{{name}}-{{part:03d}}.tar",
            "run_dir": f"{s3_bucket}/out/_run", "backend": backend}
    fs = s3_server.filesystem()
    _run_driver(tmp_path, spec, options, {}, kill_after_markers=2, s3fs_=fs)
    out, err = _run_driver(tmp_path, spec, options, {})
    assert '"ok": true' in out, out + err
    assert s3_server.secret not in out + err
    _check_outputs_and_secrets(fs, f"{s3_bucket}/out", spec["run_dir"], [s3_server.secret])


def test_job_gs_to_s3_killed_and_resumed(s3_server, s3_bucket, gcs_server, gcs_bucket, tmp_path):
    pytest.importorskip("shardflow.job.shard_job")
    pytest.importorskip("gcsfs")
    inputs = _job_inputs(gcs_server.storage_options, f"{gcs_bucket}/src")
    # per-prefix options; S3 credentials as ${VAR} references resolved from the worker's environment
    options = {
        "gs://": gcs_server.storage_options,
        "s3://": {"key": "${SF_TEST_S3_KEY}", "secret": "${SF_TEST_S3_SECRET}",
                  "client_kwargs": {"endpoint_url": s3_server.endpoint_url}},
    }
    env = {"SF_TEST_S3_KEY": s3_server.key, "SF_TEST_S3_SECRET": s3_server.secret, **gcs_server.env}
    spec = {"inputs": inputs, "outputs": f"{s3_bucket}/gs2s3/{{name}}-{{part:03d}}.tar",
            "run_dir": f"{s3_bucket}/gs2s3/_run", "backend": "processes"}
    fs = s3_server.filesystem()
    _run_driver(tmp_path, spec, options, env, kill_after_markers=2, s3fs_=fs)
    out, err = _run_driver(tmp_path, spec, options, env)
    assert '"ok": true' in out, out + err
    _check_outputs_and_secrets(fs, f"{s3_bucket}/gs2s3", spec["run_dir"], [s3_server.secret])


# ------------------------------------------------------------------------------------------------
# one line, not a store client's traceback or its multi-line message


def test_a_glob_without_credentials_and_a_folder_url_are_one_line_errors(s3_server, s3_bucket, tmp_path):
    """A glob with no credentials printed botocore's NoCredentialsError traceback (~90 lines); `ls s3://b/`
    printed "ParamValidationError: Parameter validation failed:\\nInvalid length for parameter Key"."""
    from tests.cli.test_inspect import cli

    no_credentials = {**{k: v for k, v in s3_server.env.items() if not k.startswith("AWS_SECRET")},
                      "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                      "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
    listed = cli("ls", f"{s3_bucket}/train-*.tar", env=no_credentials)
    lines = listed.stderr.decode().strip().splitlines()
    assert listed.returncode != 0 and len(lines) == 1, listed.stderr
    assert "cannot list" in lines[0] and "credentials" in lines[0] and "train-*.tar" in lines[0]
    for folder in (f"{s3_bucket}/", s3_bucket):
        opened = cli("ls", folder, env=s3_server.env)
        lines = opened.stderr.decode().strip().splitlines()
        assert opened.returncode != 0 and len(lines) == 1, opened.stderr
        assert "names a folder, not a shard" in lines[0] and "\\n" not in lines[0]
