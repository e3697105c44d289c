"""Batched jobs (task/batch.py): same bytes as per-sample, filters and 1:N, columns, errors per sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.shards.samples import read_samples
from shardflow.task.batch_values import batch_outputs, collate
from tests.support.jobs import file_bytes, make_shards, spec, tars


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 13, bad=["s000005"])  # 13: batches of 4 leave a short last one
    return directory


def _flip(sample):
    return {"__key__": sample["__key__"], "png": sample["jpg"][:, ::-1], "cls": sample["json"]["label"],
            "json": {"r": float(sf.sample_rng(sample).random())}}


def _flip_batch(batch):
    return [_flip(s) for s in batch]


def _run(fn, shards, out, **kwargs):
    job = sf.ShardJob(fn, spec(shards, "in", 2), str(out / "{name}.tar"), decode="rgb8", run_dir=str(out / "run"),
                      **kwargs)
    return job.run(kwargs.pop("backend", "serial"), progress=False)


def _samples(out):
    return [s for p in tars(out) for s in read_samples(str(p))]


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_batched_writes_the_bytes_of_per_sample(shards, tmp_path, batch_size):
    """Same function over batches of 1, 4 (short last batch) or more than a shard: identical shards, and
    the sample that does not decode is logged with its key either way."""
    single = _run(_flip, shards, tmp_path / "one")
    batched = _run(_flip_batch, shards, tmp_path / "many", batch_size=batch_size)
    assert single.ok and batched.ok
    assert file_bytes(tars(tmp_path / "one")) == file_bytes(tars(tmp_path / "many"))
    assert batched.stats.samples_in == 26 and batched.stats.samples_out == 25 and batched.stats.failed == 1
    errors = (tmp_path / "many" / "run" / "errors" / "000000.jsonl").read_text().splitlines()
    assert [json.loads(e)["key"] for e in errors] == ["s000005"]


def test_batch_is_a_list_and_never_spans_shards(shards, tmp_path):
    seen = []

    def fn(batch):
        seen.append([s["__key__"] for s in batch])
        return batch

    assert _run(fn, shards, tmp_path / "o", batch_size=4).ok
    assert [len(b) for b in seen] == [4, 3, 4, 1, 4, 4, 4, 1]  # s000005 lost at decode; 13 = 4+4+4+1
    assert all(int(b[0][1:]) // 13 == int(b[-1][1:]) // 13 for b in seen)


def test_a_bad_sample_costs_its_batch_a_retry_not_the_task(shards, tmp_path):
    """fn raises on one sample: the batch is retried one by one; that sample is logged, the rest written."""
    calls = []

    def fn(batch):
        calls.append(len(batch))
        if any(s["__key__"] == "s000010" for s in batch):
            raise ValueError("bad pixels")
        return _flip_batch(batch)

    report = _run(fn, shards, tmp_path / "o", batch_size=4)
    assert report.ok and report.stats.samples_out == 24 and report.stats.failed == 2
    assert calls[:7] == [4, 3, 4, 1, 1, 1, 1]  # the batch s000008..s000011 retried as 4 singles
    errors = (tmp_path / "o" / "run" / "errors" / "000000.jsonl").read_text()
    logged = [json.loads(line) for line in errors.splitlines()]
    assert {(e["key"], e["stage"]) for e in logged} == {("s000005", "decode"), ("s000010", "process")}
    assert "bad pixels" in [e for e in logged if e["key"] == "s000010"][0]["reason"]
    written = {s["__key__"] for s in _samples(tmp_path / "o")}
    assert "s000011" in written and "s000009" in written and "s000010" not in written


def test_filters_one_to_many_and_columns(shards, tmp_path):
    def fn(cols):  # collate=True: a dict of columns; jpg stacked (same shape), json a list
        assert isinstance(cols["jpg"], np.ndarray) and cols["jpg"].shape[1:] == (24, 32, 3)
        assert isinstance(cols["json"], list) and isinstance(cols["__key__"], list)
        keep = [i for i, meta in enumerate(cols["json"]) if meta["label"] != 0]
        return {"__key__": [cols["__key__"][i] + suffix for i in keep for suffix in ("_a", "_b")],
                "cls": [cols["json"][i]["label"] for i in keep for _ in "ab"]}

    report = _run(fn, shards, tmp_path / "o", batch_size=5, collate=True)
    assert report.ok
    keys = [s["__key__"] for s in _samples(tmp_path / "o")]
    labels = {f"s{i:06d}": i % 5 for i in range(26)}
    expected = [f"s{i:06d}{x}" for i in range(26) if i != 5 and labels[f"s{i:06d}"] for x in ("_a", "_b")]
    assert keys == expected
    assert report.stats.dropped == sum(1 for i in range(26) if i != 5 and i % 5 == 0)


def test_unchanged_values_keep_their_bytes(shards, tmp_path):
    assert _run(lambda batch: batch, shards, tmp_path / "o", batch_size=4).ok
    source = {s["__key__"]: s["jpg"] for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))}
    for sample in _samples(tmp_path / "o"):
        assert sample["jpg"] == source[sample["__key__"]]


def test_contract_errors_name_the_problem(shards, tmp_path):
    # a result that breaks the contract as a whole is a job bug, not retried per sample (a batch of one
    # would pass): the run stops naming the batch (tests/task/test_failure_policy.py has the filter case)
    report = _run(lambda batch: [1] * len(batch), shards, tmp_path / "o", batch_size=4, max_failure_rate=1.0)
    assert report.stats.samples_out == 0 and report.failed[0]["kind"] == "user"
    line = json.loads((tmp_path / "o" / "run" / "errors" / "000000.jsonl").read_text().splitlines()[-1])
    assert line["stage"] == "process" and "expected dicts" in line["reason"] and line["key"] == "s000000"
    with pytest.raises(JobError, match="batch_size"):
        sf.ShardJob(_flip_batch, "a.tar", "b.tar", batch_size=0)
    with pytest.raises(JobError, match="collate=True needs batch_size"):
        sf.ShardJob(_flip_batch, "a.tar", "b.tar", collate=True)


def test_batch_values_units():
    import torch

    cols = collate([{"a": torch.zeros(2, 3), "b": np.ones(2), "c": 1},
                    {"a": torch.ones(2, 3), "b": np.ones(3), "c": 2}])
    assert tuple(cols["a"].shape) == (2, 2, 3) and isinstance(cols["b"], list) and cols["c"] == [1, 2]
    rows = batch_outputs({"x": torch.arange(6).reshape(2, 3)}, ["k1", "k2"])
    assert [r["__key__"] for r, _ in rows] == ["k1", "k2"] and rows[1][0]["x"].tolist() == [3, 4, 5]
    assert rows[1][0]["x"].untyped_storage().nbytes() == 3 * 8  # a copy, not a view of the batch
    with pytest.raises(JobError, match="different lengths"):
        batch_outputs({"x": [1, 2], "y": [1]}, ["k1", "k2"])
    with pytest.raises(JobError, match="expected a list of dicts"):
        batch_outputs(3, ["k1"])


def test_job_file_process_batch_and_batch_size(shards, tmp_path):
    from shardflow.job.jobfile import load_job
    from tests.support.jobs import write_job

    path = write_job(tmp_path, """
        DECODE = "rgb8"
        BATCH_SIZE = 4
        SIZES = []

        def process_batch(batch):
            return [{"__key__": s["__key__"], "cls": len(batch)} for s in batch]
    """)
    job = load_job(path, inputs=spec(shards, "in", 2), outputs=str(tmp_path / "o" / "{name}.tar"))
    assert job.batch_size == 4
    assert job.run("serial", progress=False).ok
    sizes = [int(s["cls"]) for s in _samples(tmp_path / "o")]
    assert sizes[:8] == [4, 4, 4, 4, 3, 3, 3, 4]  # s000005 does not decode


def test_on_error_raise_stops_at_the_bad_sample_and_leaves_nothing_behind(shards, tmp_path):
    """on_error="raise": the first failing sample (found by the per-sample retry) fails the task with its
    key; the overlap threads end, no temp file or output shard is left."""
    import threading

    from tests.support.jobs import temp_files

    def fn(batch):
        if any(s["__key__"] == "s000002" for s in batch):
            raise ValueError("bad pixels")
        return _flip_batch(batch)

    report = _run(fn, shards, tmp_path / "o", batch_size=4, on_error="raise")
    assert not report.ok and report.done == 0
    error = report.failed[0]["error"]
    assert "s000002" in error and "bad pixels" in error
    assert tars(tmp_path / "o") == [] and temp_files(tmp_path / "o") == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("shardflow-")]
