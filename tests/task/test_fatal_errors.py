"""Fatal exceptions (MemoryError, SystemError: errors.FATAL_ERRORS) are never skipped samples: under
on_error="skip" the task fails (no done marker, no output committed) and runs again on the next run,
on the per-sample path, the overlapped decoding path and the batched path; the reader raises them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardflow.codecs import register_codec
from shardflow.codecs.registry import unregister_codec
from shardflow.errors import DecodeError
from shardflow.job.shard_job import ShardJob
from shardflow.reader.dataset import ShardDataset
from shardflow.shards.writer import TarWriter
from tests.support.jobs import keys_in, make_shards, tars

POISON = "s000004"  # the sample the fatal exception strikes (task 0: shard in-000000)


def _armed(sample: dict) -> bool:
    return (Path(sample["__url__"]).parent / "ARMED").exists()


def out_of_memory(sample):
    if sample["__key__"] == POISON and _armed(sample):
        raise MemoryError("cannot allocate 96 GiB")
    return {"__key__": sample["__key__"], "json": sample["json"]}


def system_error(sample):
    if sample["__key__"] == POISON and _armed(sample):
        raise SystemError("error return without exception set")
    return {"__key__": sample["__key__"], "json": sample["json"]}


def too_deep(sample):
    if sample["__key__"] == POISON and _armed(sample):
        raise RecursionError("maximum recursion depth exceeded")
    return {"__key__": sample["__key__"], "json": sample["json"]}


def batch_out_of_memory(batch):
    if any(s["__key__"] == POISON for s in batch) and _armed(batch[0]):
        raise MemoryError("cannot allocate 96 GiB")
    return [{"__key__": s["__key__"], "json": s["json"]} for s in batch]


def _job(tmp_path: Path, fn, **kw) -> ShardJob:
    make_shards(tmp_path / "in", 2, 8)
    (tmp_path / "in" / "ARMED").touch()
    return ShardJob(fn, str(tmp_path / "in" / "in-{000000..000001}.tar"), f"{tmp_path}/out/{{name}}.tar",
                    on_error="skip", **kw)


def _fails_then_resumes(tmp_path: Path, job: ShardJob, name: str, key: str = POISON) -> None:
    report = job.run("serial", progress=False)
    assert list(report.failed) == [0], "the fatal exception fails its task, not a skipped sample"
    failure = report.failed[0]["error"]
    assert name in failure and f"key '{key}'" in failure and "fatal" in failure
    run_dir = tmp_path / "out" / "_shardflow"
    assert not (run_dir / "done" / "000000.json").exists()
    assert [p.name for p in tars(tmp_path / "out")] == ["in-000001.tar"]  # task 0's output not committed
    assert report.stats.failed == 0  # not counted as a dropped sample
    (tmp_path / "in" / "ARMED").unlink()  # the worker has its memory back
    again = job.run("serial", progress=False)
    assert again.ok and again.done == 2
    assert sum(keys_in(tars(tmp_path / "out")).values()) == 16  # every sample written, none lost


@pytest.mark.parametrize("fn, name", [(out_of_memory, "MemoryError"), (system_error, "SystemError")])
def test_fatal_exception_in_process_fails_the_task_under_skip(tmp_path, fn, name):
    _fails_then_resumes(tmp_path, _job(tmp_path, fn), name)


def test_fatal_exception_in_a_batch_fails_the_task_without_sample_by_sample_retry(tmp_path):
    # named by its batch's first key (s000003..s000005)
    _fails_then_resumes(tmp_path, _job(tmp_path, batch_out_of_memory, batch_size=3), "MemoryError", "s000003")


def test_recursion_error_stays_a_skipped_sample(tmp_path):
    report = _job(tmp_path, too_deep).run("serial", progress=False)
    assert report.ok and report.stats.failed == 1  # deterministic per sample: the policy judges it


def _decode_boom(data: bytes):
    if data == b"boom":
        raise MemoryError("cannot allocate the decoded value")
    return data


@pytest.fixture
def boom_codec():
    register_codec("boom", decode=_decode_boom)
    yield
    unregister_codec("boom")


def passthrough(sample):
    return {"__key__": sample["__key__"], "json": sample["json"]}


def _boom_shards(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for shard in range(2):
        with TarWriter(str(directory / f"in-{shard:06d}.tar")) as writer:
            for i in range(6):
                key = f"k{shard}{i}"
                writer.write({"__key__": key, "json": json.dumps({"i": i}).encode(),
                              "boom": b"boom" if (shard, i) == (0, 2) else b"fine"})
    return str(directory / "in-{000000..000001}.tar")


def test_fatal_exception_inside_a_decoder_fails_the_task(tmp_path, boom_codec):
    """A codec wraps what it met (DecodeError from MemoryError): the cause is what counts. A decoding job
    runs overlapped (read + decode in a thread): the failure comes back to the task's thread."""
    job = ShardJob(passthrough, _boom_shards(tmp_path / "in"), f"{tmp_path}/out/{{name}}.tar", decode="rgb",
                   on_error="skip")
    report = job.run("serial", progress=False)
    assert list(report.failed) == [0]
    assert "MemoryError" in report.failed[0]["error"] and "k02" in report.failed[0]["error"]
    assert [p.name for p in tars(tmp_path / "out")] == ["in-000001.tar"]


def test_reader_raises_a_fatal_decode_error_whatever_on_error(tmp_path, boom_codec):
    spec = _boom_shards(tmp_path / "in")
    with pytest.raises(DecodeError) as info:
        list(ShardDataset(spec, decode="rgb", on_error="warn", map=lambda s: s))
    assert isinstance(info.value.__cause__, MemoryError)
