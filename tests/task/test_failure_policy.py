"""The error policy's judgements (task/failures.py, task/batch.py): what fails a task, what stops the run,
and what the messages say. Small raw-byte shards (no decode), serial runs: fast."""

from __future__ import annotations

import json

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.rundir.report import RunFailed
from shardflow.rundir.stats import Stats
from shardflow.task.failures import SampleFailures, TaskFailed
from tests.support.jobs import make_shards, spec, tars


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 1, 5)  # s000000..s000004: jpg + json, read as raw bytes
    return directory


def _run(fn, shards, out, **settings):
    settings.setdefault("on_error", "skip")
    job = sf.ShardJob(fn, spec(shards, "in", 1), str(out / "{name}.tar"), run_dir=str(out / "run"), **settings)
    return job.run("serial", progress=False)


def _errors(out):
    return [json.loads(line) for line in (out / "run" / "errors" / "000000.jsonl").read_text().splitlines()]


# -- a batched fn's result that breaks the contract as a whole: a job bug, not retried per sample ----------

def _keep_first_without_key(batch):
    return [{"json": s["json"]} for s in batch[:1]]


def test_a_batched_filter_that_forgets_keys_stops_the_run(shards, tmp_path):
    """1 output without __key__ for 2 inputs: retried one by one, each batch of one passed (1 for 1), so
    every sample was written unchanged under its own key: a filter became a silent identity."""
    report = _run(_keep_first_without_key, shards, tmp_path / "o", batch_size=2)
    assert not report.ok and report.done == 0 and tars(tmp_path / "o") == []
    failure = report.failed[0]
    assert failure["kind"] == "user", failure
    assert "1 samples for 2 inputs without __key__" in failure["error"] and "'s000000'" in failure["error"]
    assert "the run stops" in failure["error"]
    [line] = _errors(tmp_path / "o")
    assert line["stage"] == "process" and line["type"] == "JobError" and line["key"] == "s000000"


def test_a_batched_result_of_non_dicts_stops_the_run(shards, tmp_path):
    report = _run(lambda batch: [1] * len(batch), shards, tmp_path / "o", batch_size=2, on_error="raise")
    assert report.failed[0]["kind"] == "user" and "expected dicts" in report.failed[0]["error"]


def _generator_failing_on(bad):
    def fn(batch):
        for sample in batch:
            if sample["__key__"] == bad:
                raise ValueError("bad pixels")
            yield sample
    return fn


def test_an_exception_of_the_job_in_a_batch_is_still_found_sample_by_sample(shards, tmp_path):
    """The per-sample fallback stays for the job's own exceptions, also raised inside a generator fn
    (its body runs when its outputs are read, apart from the contract check of the result)."""
    report = _run(_generator_failing_on("s000003"), shards, tmp_path / "o", batch_size=2)
    assert report.ok and report.stats.samples_out == 4 and report.stats.failed == 1
    [line] = _errors(tmp_path / "o")
    assert line["key"] == "s000003" and line["type"] == "ValueError"


# -- max_failure_rate: the rule as stated at a task's end; the floor of 10 only for an early stop ---------

def _failing(count):
    def fn(sample):
        if int(sample["__key__"][1:]) < count:
            raise ValueError("bad")
        return sample
    return fn


def test_the_failure_rate_holds_at_the_end_however_few_failed(shards, tmp_path):
    """3 of 5 (60%) failed: more than the default 0.5, so the task fails (it was done: the rate needed
    min(10, samples) failures, i.e. every sample of a task under 10)."""
    report = _run(_failing(3), shards, tmp_path / "o")
    assert not report.ok and report.failed[0]["kind"] == "input"
    assert "3 of 5 samples failed (more than max_failure_rate=0.5)" in report.failed[0]["error"]
    with pytest.raises(RunFailed):
        report.raise_for_failures()
    assert _run(_failing(2), shards, tmp_path / "p").ok  # 2 of 5: under the rate
    assert not _run(_failing(1), shards, tmp_path / "q", max_failure_rate=0).ok  # any failure is more than 0


def test_the_early_stop_waits_for_ten_failures():
    """While streaming, a first failure (1 of 1) must not end a task its other samples may keep under the
    rate; at the end the whole count is known."""
    stats = Stats()
    failures = SampleFailures(0, stats, "skip", 0.5)
    for index in range(9):
        stats.samples_in += 1
        failures.record(ValueError("bad"), "a.tar", f"k{index}", "decode")  # checks the rate: no stop yet
    stats.samples_in += 8
    failures.check_rate(final=False)  # 9 of 17: under the floor while streaming
    with pytest.raises(TaskFailed, match="9 of 17 samples failed"):
        failures.check_rate(final=True)
    stats.samples_in += 2  # 9 of 19 read so far
    with pytest.raises(TaskFailed, match="10 of 19 samples failed"):
        failures.record(ValueError("bad"), "a.tar", "k9", "decode")  # the 10th: the early stop may judge


# -- messages ---------------------------------------------------------------------------------------------

def _same_key_twice(sample):
    yield {"__key__": "k", "json": b"1"}
    yield {"__key__": "k", "json": b"2"}


def test_a_key_made_twice_counts_samples_not_failures(shards, tmp_path):
    report = _run(_same_key_twice, shards, tmp_path / "o")
    error = report.failed[0]["error"]
    assert report.failed[0]["kind"] == "user"
    assert "every sample (5 of 5)" in error, error  # 9 failures (each later 'k' twice), 5 samples
    assert "produced twice (by input sample 's000000')" in error, error


def _non_str_name(sample):
    return {"json": sample["json"], 5: b"x"}


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_non_str_entry_name_is_a_job_bug(shards, tmp_path, batch_size):
    fn = _non_str_name if batch_size is None else (lambda batch: [_non_str_name(s) | {"__key__": s["__key__"]}
                                                                  for s in batch])
    report = _run(fn, shards, tmp_path / "o", batch_size=batch_size)
    error = report.failed[0]["error"]
    assert report.failed[0]["kind"] == "user", error
    assert "output entry name 5 is int: entry names must be str" in error and "AttributeError" not in error
    assert {line["stage"] for line in _errors(tmp_path / "o")} == {"process"}


def test_a_misspelled_encode_option_is_refused_when_the_job_is_made():
    with pytest.raises(JobError, match=r"unknown encode option 'png_compres_level'; valid: jpeg_quality, "
                                       r"png_compress_level, webp_quality, png_deflate"):
        sf.ShardJob(_failing(0), "a.tar", "b.tar", encode=dict(png_compres_level=3))
    with pytest.raises(JobError, match="unknown encode option"):
        sf.ShardJob(_failing(0), "a.tar", "b.tar").replace(encode={"jpeg_qualty": 80})
    assert sf.ShardJob(_failing(0), "a.tar", "b.tar", encode=dict(png_compress_level=3)).spec.encode == {
        "png_compress_level": 3}


def test_a_misspelled_decode_is_refused_when_the_job_is_made():
    with pytest.raises(JobError, match=r"decode='rgbb': unknown image spec 'rgbb'; use None or one of: pil"):
        sf.ShardJob(_failing(0), "a.tar", "b.tar", decode="rgbb")
    with pytest.raises(JobError, match=r"decode='rgb8-cuda': GPU decode gives torchrgb8-cuda"):
        sf.ShardJob(_failing(0), "a.tar", "b.tar", decode="rgb8-cuda")
    assert sf.ShardJob(_failing(0), "a.tar", "b.tar", decode="torchrgb8-cuda").spec.decode == "torchrgb8-cuda"
