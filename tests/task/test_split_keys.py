"""Split keys in a job (issue 26, item 19): a key whose members are not adjacent in an input shard is
never written as a sample missing members. The task runs again without the key; the reader keeps
reporting (tests/shards). Shards are generated here."""

from __future__ import annotations

import io

import pytest

import shardflow as sf
from shardflow.shards.samples import read_samples
from tests.support.tar_corruption import tar_of


def _split_shard(path) -> None:
    # 'a' has a part at the start and one after 'b': its first part alone is a sample missing a member
    path.write_bytes(tar_of([("a.cls", b"1"), ("b.cls", b"2"), ("b.txt", b"bb"), ("a.txt", b"aa"), ("c.cls", b"3"),
                             ("d.cls", b"4")]))


def _keys(paths) -> list[str]:
    return sorted(s["__key__"] for p in paths for s in read_samples(io.BytesIO(p.read_bytes()), str(p)))


def _identity(sample):
    return sample


def _identity_batch(samples):
    return samples


@pytest.mark.parametrize("options", [{}, {"maxcount": 1}, {"batch_size": 2}], ids=["one-shard", "rollover", "batched"])
def test_a_job_under_skip_never_writes_the_first_part_of_a_split_key(tmp_path, options):
    _split_shard(tmp_path / "in-000.tar")
    fn = _identity_batch if "batch_size" in options else _identity
    job = sf.ShardJob(fn, inputs=str(tmp_path / "in-000.tar"), outputs=str(tmp_path / "out/o-{task}.tar"),
                      decode=None, on_error="skip", **options)
    report = job.run("serial")
    assert report.ok
    written = sorted((tmp_path / "out").glob("o-*.tar"))
    assert _keys(written) == ["b", "c", "d"]  # no 'a': neither part of it
    assert len(written) == (3 if "maxcount" in options else 1)  # the first run's 4th shard is gone
    assert report.stats.samples_out == 3 and report.stats.failed >= 1


def test_a_job_under_raise_fails_the_task_at_a_split_key(tmp_path):
    _split_shard(tmp_path / "in-000.tar")
    job = sf.ShardJob(_identity, inputs=str(tmp_path / "in-000.tar"), outputs=str(tmp_path / "out/o-{task}.tar"),
                      decode=None, on_error="raise")
    report = job.run("serial")
    assert not report.ok and not list((tmp_path / "out").glob("o-*.tar"))
