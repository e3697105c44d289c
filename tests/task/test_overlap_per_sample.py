"""The per-sample path of a decoding job runs overlapped (task/process.py: read + decode | fn | encode +
write in three threads): the same shard bytes, stats and error log as sample by sample inline."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import shardflow as sf
import shardflow.task.process as process
from shardflow.codecs import register_codec
from shardflow.codecs.registry import unregister_codec
from shardflow.shards.samples import read_samples
from tests.support.jobs import file_bytes, make_shards, spec, tars, temp_files

ENCODED_ON: set[str] = set()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 11, bad=["s000004"])  # 11 a shard: chunks of 4 leave a short last one
    return directory


@pytest.fixture
def thread_codec():
    """A codec that notes the thread it encodes on."""
    def encode(value):
        ENCODED_ON.add(threading.current_thread().name)
        return json.dumps(value).encode()

    ENCODED_ON.clear()
    register_codec("where", encode=encode)
    yield
    unregister_codec("where")


def _fn(sample):
    """Every shape of result: 1:1 (noisy pixels), dropped, skipped, failed, 1:N."""
    index = sample["json"]["index"]
    if index % 7 == 3:
        return None
    if index % 7 == 5:
        raise sf.SkipSample("seven five")
    if index == 9:
        raise ValueError("bad nine")
    rng = sf.sample_rng(sample)
    noisy = (sample["jpg"] ^ rng.integers(0, 8, sample["jpg"].shape, dtype="uint8"))
    out = {"__key__": sample["__key__"], "png": noisy, "cls": index % 3, "where": [index, float(rng.random())]}
    if index % 7 == 6:
        return [out, {"__key__": sample["__key__"] + "_b", "jpg": sample["jpg"]}]  # jpg unchanged: its own bytes
    return out


def _run(shards, out, overlapped, monkeypatch, **settings):
    monkeypatch.setattr(process, "OVERLAP_ENABLED", overlapped)
    job = sf.ShardJob(_fn, spec(shards, "in", 2), str(out / "{name}.tar"), decode="rgb8", run_dir=str(out / "run"),
                      maxcount=3, inputs_per_task=2, max_failure_rate=1.0, **settings)
    return job.run("serial", progress=False)


def _errors(out):
    lines = (out / "run" / "errors" / "000000.jsonl").read_text().splitlines()
    return sorted((e["key"], e["stage"], e["type"]) for e in map(json.loads, lines))


def test_overlapped_writes_the_bytes_of_inline(shards, tmp_path, monkeypatch, thread_codec):
    inline = _run(shards, tmp_path / "inline", False, monkeypatch)
    assert ENCODED_ON == {threading.current_thread().name}
    ENCODED_ON.clear()
    overlapped = _run(shards, tmp_path / "overlap", True, monkeypatch)
    assert ENCODED_ON == {"shardflow-write"}  # encoded beside fn, not after it
    assert inline.ok and overlapped.ok
    assert len(tars(tmp_path / "overlap")) > 2  # rolled over (maxcount=3) inside the task
    assert file_bytes(tars(tmp_path / "inline")) == file_bytes(tars(tmp_path / "overlap"))
    assert overlapped.stats.to_json() | {"seconds": 0} == inline.stats.to_json() | {"seconds": 0}
    assert _errors(tmp_path / "overlap") == _errors(tmp_path / "inline") == [
        ("s000004", "decode", "DecodeError"), ("s000009", "process", "ValueError")]
    source = {s["__key__"]: s["jpg"] for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))}
    passed = [s for p in tars(tmp_path / "overlap") for s in read_samples(str(p)) if s["__key__"].endswith("_b")]
    assert passed and all(s["jpg"] == source[s["__key__"][:-2]] for s in passed)


def test_overlapped_trial_stops_at_the_limit(shards, tmp_path, monkeypatch, thread_codec):
    inline = _run(shards, tmp_path / "inline", False, monkeypatch, limit=13)
    overlapped = _run(shards, tmp_path / "overlap", True, monkeypatch, limit=13)
    assert overlapped.stats.samples_in == inline.stats.samples_in == 13


def test_overlapped_raise_policy_fails_the_task_at_the_first_bad_sample(shards, tmp_path, monkeypatch, thread_codec):
    monkeypatch.setattr(process, "OVERLAP_ENABLED", True)
    job = sf.ShardJob(_fn, spec(shards, "in", 2), str(tmp_path / "o" / "{name}.tar"), decode="rgb8",
                      run_dir=str(tmp_path / "o" / "run"), on_error="raise")
    report = job.run("serial", progress=False)
    assert not report.ok and "s000004" in report.failed[0]["error"]
    assert not tars(tmp_path / "o")  # the shard in progress was aborted: nothing under a final name


def _dies_once(sample):
    """Kills its worker process (no cleanup at all) at one sample, the first time only."""
    flag = Path(sample["__url__"]).parent / "died-once"
    if sample["__key__"] == "s000016" and not flag.exists():
        flag.write_text("x")
        os._exit(1)
    return {"__key__": sample["__key__"], "png": sample["jpg"][::-1], "cls": sample["json"]["label"]}


def test_an_overlapped_worker_killed_mid_task_leaves_no_shard_and_the_rerun_writes_the_same_bytes(tmp_path):
    """Exactly once under a kill: the threads of the killed task leave only temps; the rerun removes them
    and writes what a run without the kill writes."""
    make_shards(tmp_path / "in", 2, 11)
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "died-once").write_text("x")  # the clean run's inputs never kill
    make_shards(tmp_path / "clean", 2, 11)

    def run(inputs, out):
        job = sf.ShardJob(_dies_once, spec(inputs, "in", 2), str(out / "{name}.tar"), decode="rgb8",
                          run_dir=str(out / "run"), maxcount=4, io_retries=0)  # a worker's death: no retry in the run
        return job.run("processes", workers=2, progress=False)

    first = run(tmp_path / "in", tmp_path / "out")
    assert not first.ok and (tmp_path / "in" / "died-once").exists()
    assert not (tmp_path / "out" / "run" / "done" / "000001.json").exists()  # the killed task is not done
    second = run(tmp_path / "in", tmp_path / "out")
    assert second.ok and not temp_files(tmp_path / "out")
    assert (tmp_path / "out" / "run" / "done" / "000001.json").exists()
    clean = run(tmp_path / "clean", tmp_path / "clean-out")
    assert clean.ok
    assert file_bytes(tars(tmp_path / "out")) == file_bytes(tars(tmp_path / "clean-out"))
