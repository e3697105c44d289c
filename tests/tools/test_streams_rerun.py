"""A stream, in or out, is never "already done" (job.rerun.Rerun.for_stream, applied by the driver): a job
reading standard input (`-`) reads it again on every run, in the Python API as in the CLI, and the choices
that build on an earlier run (extend, retry_failed) are refused in one line; and the runner's hint after
failed samples suggests --retry-failed only when a retry could change something."""

from __future__ import annotations

import io
import sys
import tarfile

import pytest

from shardflow.errors import JobError
from shardflow.job.rerun import Rerun, stream_of
from shardflow.job.shard_job import ShardJob
from shardflow.tools.runner import outcome
from shardflow.tools.sort import passthrough


def tar_bytes(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def names(path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


class _Stdin:
    """What sys.stdin is for the driver: a text stream whose .buffer holds the bytes piped in."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def run_on_stdin(monkeypatch, data: bytes, out, **options):
    monkeypatch.setattr(sys, "stdin", _Stdin(data))
    job = ShardJob(passthrough, "-", str(out), run_dir=str(out.parent / "run"))
    return job.run("serial", progress=False, **options)


def test_a_job_reading_stdin_reads_the_new_data_on_every_run(tmp_path, monkeypatch):
    out = tmp_path / "out.tar"
    first = run_on_stdin(monkeypatch, tar_bytes({"s0.txt": "A"}), out)
    assert first.ok and names(out) == ["s0.txt"]
    second = run_on_stdin(monkeypatch, tar_bytes({"s0.txt": "B", "s1.txt": "B1"}), out)
    assert second.ok and second.stats.samples_out == 2  # was: "1 already done before", 0 samples, new data lost
    assert names(out) == ["s0.txt", "s1.txt"]
    with tarfile.open(out) as tar:
        assert tar.extractfile("s0.txt").read() == b"B"


@pytest.mark.parametrize("choice, flag", [("extend", "--extend"), ("retry_failed", "--retry-failed")])
def test_a_stream_job_refuses_what_builds_on_an_earlier_run(tmp_path, monkeypatch, choice, flag):
    with pytest.raises(JobError) as caught:
        run_on_stdin(monkeypatch, tar_bytes({"s0.txt": "A"}), tmp_path / "out.tar", **{choice: True})
    message = str(caught.value)
    assert flag in message and "standard input" in message and "redo" not in message
    assert not (tmp_path / "out.tar").exists()


def test_one_rule_names_a_stream_in_or_out():
    assert stream_of("-", "out.tar") == "reads standard input (-)"
    assert stream_of(["a.tar", "-"], "o/{name}.tar") == "reads standard input (-)"
    assert stream_of("a.tar", "-") == "writes standard output (-o -)"
    assert stream_of("a.tar::b.tar", "o.tar") is None and stream_of({"collections": []}, "o.tar") is None
    assert Rerun().for_stream("reads standard input (-)").redo
    assert Rerun().for_stream(None) == Rerun()


def fails_on_s1(sample: dict) -> dict:
    """A job whose failures a retry could change (a fixed bug, a service back up)."""
    if sample["__key__"] == "s1":
        raise ValueError("the service did not answer")
    return sample


def test_the_hint_never_offers_a_retry_for_keys_the_input_holds_twice(tmp_path):
    shard = tmp_path / "in.tar"
    shard.write_bytes(tar_bytes({"s0.txt": "A", "s1.txt": "B"}))
    cat = ShardJob(passthrough, [str(shard), str(shard)], str(tmp_path / "all.tar"), inputs_per_task=2,
                   run_dir=str(tmp_path / "run-cat"))
    status, line = outcome(cat.run("serial", progress=False))
    assert status == 0 and "2 samples were left out" in line and "more than once in the inputs" in line
    assert "--retry-failed" not in line  # was: "rerun with --retry-failed", which gives the same result
    flaky = ShardJob(fails_on_s1, str(shard), str(tmp_path / "flaky.tar"), run_dir=str(tmp_path / "run-flaky"))
    status, line = outcome(flaky.run("serial", progress=False))
    assert status == 0 and "--retry-failed" in line
