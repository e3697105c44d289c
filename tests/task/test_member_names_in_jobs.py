"""Member names between reader, job and writer: a sample the reader yields is never refused by the
writer for its extension; an output the writer refuses is that sample's failure (the shard named),
not the task's; a hostile member name in the input (`tar -P`, `..`) is bad input, never a job bug."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardflow as sf
from tests.support.jobs import errors_logged, keys_in, tars


def _shard(path: Path, *names: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return str(path)


def same(sample):
    return sample  # a batch (a list of samples) too


def shout(sample):
    """A job bug on one sample: an upper-case extension, which would read back lower-cased."""
    if isinstance(sample, list):  # batched
        return [shout(one) for one in sample]
    ext = "TXT" if sample["__key__"] == "b" else "txt"
    return {"__key__": sample["__key__"], ext: b"y"}


def dotdot(sample):
    return {"__key__": f"{sample['__key__']}/../x", "txt": b"y"}


def _run(tmp_path: Path, fn, inputs: str, **kw):
    kw.setdefault("on_error", "skip")
    return sf.ShardJob(fn, inputs, str(tmp_path / "out" / "{name}.tar"), decode=None, retry_backoff=0.01,
                       **kw).run("serial", progress=False)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_extension_the_reader_reads_is_written(tmp_path, batch_size):
    inputs = _shard(tmp_path / "in" / "in.tar", "a.txt", "b..txt", "c.txt")
    report = _run(tmp_path, same, inputs, batch_size=batch_size)
    assert report.ok, report
    with tarfile.open(tars(tmp_path / "out")[0]) as tar:
        assert tar.getnames() == ["a.txt", "b..txt", "c.txt"]


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_output_the_writer_refuses_is_its_sample_failure(tmp_path, batch_size):
    inputs = _shard(tmp_path / "in" / "in.tar", "a.txt", "b.txt", "c.txt")
    report = _run(tmp_path, shout, inputs, batch_size=batch_size, max_failure_rate=0.5)
    assert report.ok and report.stats.failed == 1, report
    assert keys_in(tars(tmp_path / "out")) == {"a": 1, "c": 1}  # the neighbours are written
    [error] = errors_logged(Path(report.run_dir))
    assert (error["shard"], error["key"], error["stage"], error["type"]) == (inputs, "b", "process", "JobError")
    assert "extension 'TXT' is not lower-case" in error["reason"]

    strict = _run(tmp_path / "strict", shout, inputs, batch_size=batch_size, on_error="raise")
    assert list(strict.failed) == [0]
    assert f"shard {inputs}, key 'b'" in strict.failed[0]["error"]


def test_hostile_member_names_are_bad_input_not_a_job_bug(tmp_path):
    inputs = _shard(tmp_path / "in" / "in.tar", "a.txt", "../b.txt", "/abs/c.txt", "d.txt")
    report = _run(tmp_path, same, inputs, max_failure_rate=0.6)
    assert report.ok and report.stats.failed == 2, report
    assert keys_in(tars(tmp_path / "out")) == {"a": 1, "d": 1}
    logged = {(e["key"], e["stage"], e["type"], e["shard"]) for e in errors_logged(Path(report.run_dir))}
    assert logged == {("../b", "read", "SampleError", inputs), ("/abs/c", "read", "SampleError", inputs)}

    hostile = _shard(tmp_path / "bad" / "in.tar", "../b.txt", "/abs/c.txt")
    for on_error in ("skip", "raise"):
        failed = _run(tmp_path / on_error, same, hostile, on_error=on_error).failed
        assert list(failed) == [0] and failed[0]["kind"] == "input", failed
        assert "bug in the job" not in failed[0]["error"] and "key '../b'" in failed[0]["error"]


def test_a_bad_key_the_job_makes_from_a_good_one_stays_a_job_bug(tmp_path):
    inputs = _shard(tmp_path / "in" / "in.tar", "a.txt", "b.txt")
    failed = _run(tmp_path, dotdot, inputs).failed
    assert list(failed) == [0] and failed[0]["kind"] == "user" and "bug in the job" in failed[0]["error"]
