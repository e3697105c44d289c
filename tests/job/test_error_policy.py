"""The error policy, end to end: bad shards, bad samples, broken functions, I/O retries.

Each case checks that the user gets a message they can act on, that the good samples and the good
tasks finish (their outputs committed), and that errors/ in the run directory names every dropped
sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

import shardflow as sf
from shardflow.errors import JobError
from tests.support.jobs import errors_logged, keys_in, make_shards, tars, temp_files


def copy_fn(sample):
    return {"__key__": sample["__key__"], "jpg": sample["jpg"], "cls": sample["json"]["label"]}


def _job(tmp_path, fn, inputs, **kwargs):
    kwargs.setdefault("retry_backoff", 0.01)
    return sf.ShardJob(fn, inputs, str(tmp_path / "out" / "{name}.tar"), decode=kwargs.pop("decode", "rgb8"), **kwargs)


def _failed_task_message(report, task_id):
    assert task_id in report.failed, str(report)
    return report.failed[task_id]["error"]


def test_missing_truncated_and_undecodable_inputs(tmp_path):
    inputs = make_shards(tmp_path / "in", 3, 10, bad={"s000003", "s000005"})
    truncated = Path(inputs[2])
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    missing = str(tmp_path / "in" / "in-000009.tar")
    report = _job(tmp_path, copy_fn, inputs + [missing]).run("serial")

    assert not report.ok and report.done == 2 and sorted(report.failed) == [2, 3]
    message = _failed_task_message(report, 2)
    assert f"shard {truncated}" in message and "truncated tar" in message and "key 's0000" in message
    message = _failed_task_message(report, 3)
    assert "input shard missing" in message and missing in message and "no such file" in message
    assert "using --redo" in message  # the flag that replans (--force is its hidden, older name)
    assert report.failed[3]["kind"] == "input"

    # the good tasks finished: all their good samples are in their committed outputs
    outputs = tars(tmp_path / "out")
    assert [p.name for p in outputs] == ["in-000000.tar", "in-000001.tar"]
    expected = {f"s{i:06d}" for i in range(20)} - {"s000003", "s000005"}
    assert set(keys_in(outputs)) == expected and sum(keys_in(outputs).values()) == 18
    assert not temp_files(tmp_path / "out")

    errors = errors_logged(Path(report.run_dir))
    by_key = {e["key"]: e for e in errors}
    assert by_key["s000003"]["stage"] == "decode" and "cannot decode 'jpg'" in by_key["s000003"]["reason"]
    assert by_key["s000005"]["shard"] == inputs[0] and by_key["s000005"]["type"] == "DecodeError"
    truncation = [e for e in errors if e["task"] == 2]
    assert len(truncation) == 1 and truncation[0]["type"] == "FormatError" and truncation[0]["stage"] == "read"
    assert [e["shard"] for e in errors if e["task"] == 3] == [missing]
    assert report.stats.failed == 2 and report.stats.fail_reasons["DecodeError"] == 2
    assert "DecodeError (2)" in str(report) and "FAILED task 2 [input]" in str(report)


def test_bad_function_results_are_logged_per_sample(tmp_path):
    def fn(sample):
        key = sample["__key__"]
        number = int(key[1:])
        if number == 1:
            raise ValueError("cannot handle this one")
        if number == 2:
            return "not a dict"
        if number == 3:
            return [{"__key__": "dup", "txt": "a"}, {"__key__": "dup", "txt": "b"}]
        if number == 4:
            return {"__key__": "bad.key", "txt": "x"}
        if number == 5:
            return {"__key__": key, "txt": object()}  # no encoder for an object under txt
        if number == 6:
            return None  # dropped on purpose: not an error
        if number == 7:
            raise sf.SkipSample("too boring")
        return {"__key__": key, "txt": "ok"}

    inputs = make_shards(tmp_path / "in", 2, 10)
    report = _job(tmp_path, fn, inputs, decode=None).run("serial")
    assert report.ok, str(report)
    stats = report.stats
    assert stats.samples_in == 20 and stats.dropped == 1 and stats.skipped == 1
    assert stats.skip_reasons == {"too boring": 1}
    errors = {(e["key"], e["stage"]): e for e in errors_logged(Path(report.run_dir))}
    assert errors[("s000001", "process")]["reason"] == "ValueError: cannot handle this one"
    assert "fn returned str; expected a dict, None, or an iterable of dicts" in errors[("s000002", "process")]["reason"]
    assert "output key 'dup' produced twice" in errors[("s000003", "process")]["reason"]
    assert "has a '.' in its last path part" in errors[("s000004", "process")]["reason"]
    assert "no encoder for extension 'txt'" in errors[("s000005", "encode")]["reason"]
    assert len(errors) == 5 and stats.failed == 5
    kept = keys_in(tars(tmp_path / "out"))
    # 20 in; 1, 2, 4, 5 failed, 6 dropped, 7 skipped; sample 3 wrote its first "dup" before the clash
    assert set(kept) == {f"s{i:06d}" for i in range(8, 20)} | {"s000000", "dup"}
    assert all(count == 1 for count in kept.values())


def test_too_many_failures_fail_only_that_task(tmp_path):
    bad = {f"s{i:06d}" for i in range(12, 24)}  # all of shard 1
    inputs = make_shards(tmp_path / "in", 3, 12, bad=bad)
    report = _job(tmp_path, copy_fn, inputs).run("serial")
    assert sorted(report.failed) == [1] and report.done == 2
    message = report.failed[1]["error"]
    assert "samples failed (more than max_failure_rate=0.5)" in message
    assert "most often at decode: DecodeError" in message and "e.g. key 's000012'" in message
    assert [p.name for p in tars(tmp_path / "out")] == ["in-000000.tar", "in-000002.tar"]
    assert {e["key"] for e in errors_logged(Path(report.run_dir)) if e["task"] == 1} >= {"s000012", "s000013"}


def test_a_few_bad_samples_at_the_start_do_not_fail_the_task(tmp_path):
    inputs = make_shards(tmp_path / "in", 1, 30, bad={"s000000", "s000001"})
    report = _job(tmp_path, copy_fn, inputs).run("serial")
    assert report.ok, str(report)
    assert report.stats.samples_out == 28


def test_on_error_raise_stops_at_the_first_error(tmp_path):
    calls = []

    def fn(sample):
        calls.append(sample["__key__"])
        if sample["__key__"] == "s000004":
            raise RuntimeError("first bad sample")
        return {"__key__": sample["__key__"], "txt": "ok"}

    inputs = make_shards(tmp_path / "in", 3, 5)
    report = _job(tmp_path, fn, inputs, decode=None, on_error="raise").run("serial")
    assert not report.ok and list(report.failed) == [0]
    assert report.failed[0]["kind"] == "user"
    assert "key 's000004', process: RuntimeError: first bad sample" in report.failed[0]["error"]
    assert calls[-1] == "s000004" and len(calls) == 5  # tasks 1 and 2 never started
    assert tars(tmp_path / "out") == [] and not temp_files(tmp_path / "out")


def test_output_spec_must_match_the_tasks(tmp_path):
    inputs = make_shards(tmp_path / "in", 3, 2)
    job = sf.ShardJob(copy_fn, inputs, str(tmp_path / "out" / "o-{0..1}.tar"))
    with pytest.raises(JobError) as info:
        job.plan()
    message = str(info.value)
    assert "outputs name 2 shards but the inputs make 3 tasks" in message and "{name}" in message


# -- I/O errors: retried with backoff, a bounded number of times -------------------------------------
class FlakyFileSystem(LocalFileSystem):
    """Local files behind a `flaky://` URL whose first `failures` opens for writing raise OSError.

    The count lives in a file, so it is shared with every process that uses the filesystem.
    """

    protocol = "flaky"
    counter: str = ""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_mkdir", True)
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("flaky://"):
            path = path[len("flaky://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and self.counter:
            state = json.loads(Path(self.counter).read_text())
            if state["left"] > 0:
                state["left"] -= 1
                Path(self.counter).write_text(json.dumps(state))
                raise ConnectionError(f"injected network failure writing {os.path.basename(path)}")
        return super()._open(path, mode, **kwargs)


@pytest.fixture()
def flaky(tmp_path):
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    FlakyFileSystem.counter = str(tmp_path / "flaky.json")
    yield lambda left: Path(FlakyFileSystem.counter).write_text(json.dumps({"left": left}))
    FlakyFileSystem.counter = ""


def test_io_errors_are_retried_with_backoff(tmp_path, flaky):
    flaky(2)  # the first two attempts of task 0 fail to open their output, the third succeeds
    inputs = make_shards(tmp_path / "in", 2, 4)
    job = sf.ShardJob(copy_fn, inputs, f"flaky://{tmp_path}/out/{{name}}.tar", decode="rgb8",
                      run_dir=str(tmp_path / "run"), io_retries=3, retry_backoff=0.05)
    report = job.run("serial")
    assert report.ok, str(report)
    assert sum(keys_in(tars(tmp_path / "out")).values()) == 8
    assert json.loads(Path(FlakyFileSystem.counter).read_text())["left"] == 0
    assert not temp_files(tmp_path / "out")


def test_io_errors_that_outlive_the_retries_fail_the_task(tmp_path, flaky):
    flaky(100)
    inputs = make_shards(tmp_path / "in", 1, 4)
    job = sf.ShardJob(copy_fn, inputs, f"flaky://{tmp_path}/out/{{name}}.tar", decode="rgb8",
                      run_dir=str(tmp_path / "run"), io_retries=2, retry_backoff=0.05)
    report = job.run("serial")
    assert report.failed[0]["kind"] == "io"
    assert "I/O error after 3 attempts" in report.failed[0]["error"]
    assert "injected network failure" in report.failed[0]["error"]
    assert json.loads(Path(FlakyFileSystem.counter).read_text())["left"] == 97  # exactly 3 attempts
    assert not tars(tmp_path / "out")


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_told_why_its_workers_died(tmp_path):
    """Worker processes import the main script (spawn and forkserver do): unguarded, it would run the
    job again inside each worker. The script is told so in one line before any worker starts
    (backends.main_guard), instead of a bare 'worker died'."""
    import subprocess
    import sys

    from tests.support.jobs import cli_env

    make_shards(tmp_path / "in", 2, 2)
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import shardflow as sf\n"
        f"job = sf.ShardJob(lambda s: s, {str(tmp_path / 'in' / 'in-{000000..000001}.tar')!r}, "
        f"{str(tmp_path / 'out' / '{name}.tar')!r})\n"
        "print(job.run('processes', workers=2))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=cli_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"each imports the main script {script}, whose line 3 would run the job again" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
