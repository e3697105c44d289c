"""Issue 26 item 18: a sample can fail more than once (each output of a 1:N fn), so a task's failure
never says "2 of 1 samples failed"."""

from __future__ import annotations

import shardflow as sf
from tests.support.jobs import make_shards


def _two_bad_outputs(sample):
    return [{"__key__": sample["__key__"] + suffix, "weird": object()} for suffix in ("-a", "-b")]


def test_more_failures_than_samples_read_are_counted_as_failures(tmp_path):
    inputs = make_shards(tmp_path / "in", 1, 1)
    report = sf.ShardJob(_two_bad_outputs, inputs, str(tmp_path / "out" / "{name}.tar"),
                         run_dir=str(tmp_path / "rd")).run("serial", progress=False)
    error = report.failed[0]["error"]
    assert "2 sample failures in 1 sample read" in error
    assert "2 of 1 samples" not in error
