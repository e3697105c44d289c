"""The receipt's hash as a choice (shards/checksums.py): sha256 by default, blake3 or xxh3_128 when asked,
named in the receipt and checked against the bytes written; a missing package is a clear error."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.shards.checksums import MissingChecksum, new_hasher
from shardflow.shards.writer import ShardWriter, TarWriter

blake3 = pytest.importorskip("blake3", reason="the 'checksums' extra (blake3) is not installed")
xxhash = pytest.importorskip("xxhash", reason="the 'checksums' extra (xxhash) is not installed")

DIGESTS = {"sha256": lambda data: hashlib.sha256(data).hexdigest(),
           "blake3": lambda data: blake3.blake3(data).hexdigest(),
           "xxh3_128": lambda data: xxhash.xxh3_128(data).hexdigest()}


def _samples(count=40, size=70_000):
    return [{"__key__": f"k{i:04d}", "bin": bytes([i % 251]) * (size + i), "cls": b"%d" % i} for i in range(count)]


@pytest.mark.parametrize("checksum", sorted(DIGESTS))
def test_the_receipt_names_its_hash_and_matches_the_bytes(tmp_path, checksum):
    with TarWriter(str(tmp_path / "a.tar")) as writer:  # the default: sha256
        for sample in _samples():
            writer.write(sample)
    data = (tmp_path / "a.tar").read_bytes()
    with TarWriter(str(tmp_path / "b.tar"), checksum=checksum) as other:
        for sample in _samples():
            other.write(sample)
        receipt = other.close()
    assert (tmp_path / "b.tar").read_bytes() == data  # the hash changes the receipt, never the shard
    assert receipt.checksum == checksum and receipt.digest == DIGESTS[checksum](data)
    as_json = receipt.to_json()
    assert as_json[checksum] == DIGESTS[checksum](data)
    assert set(as_json) == {"url", "nsamples", "nbytes", checksum}  # sha256: the keys receipts always had


def test_rolled_over_shards_each_carry_the_chosen_hash(tmp_path):
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=15, checksum="blake3") as writer:
        for sample in _samples():
            writer.write(sample)
    assert len(writer.shards) == 3
    for info in writer.shards:
        assert info.checksum == "blake3" and info.digest == DIGESTS["blake3"](open(info.url, "rb").read())


def test_a_job_records_the_choice_in_its_plan_and_markers(tmp_path):
    with TarWriter(str(tmp_path / "in.tar")) as writer:
        for sample in _samples(12, 1000):
            writer.write(sample)
    job = sf.ShardJob(lambda s: s, str(tmp_path / "in.tar"), str(tmp_path / "out" / "{name}.tar"),
                      run_dir=str(tmp_path / "run"), checksum="xxh3_128")
    report = job.run("serial", progress=False)
    assert report.ok
    marker = json.loads(next((tmp_path / "run").rglob("000000.json")).read_text())
    [output] = marker["outputs"]
    assert "sha256" not in output
    assert output["xxh3_128"] == DIGESTS["xxh3_128"]((tmp_path / "out" / "in.tar").read_bytes())
    assert job.spec.describe()["checksum"] == "xxh3_128" and job.spec.settings()["checksum"] == "xxh3_128"
    assert "checksum" not in job.replace(checksum=None).spec.settings()  # default plans keep their fingerprint


def test_unknown_or_missing_hashes_are_refused_by_name(monkeypatch):
    with pytest.raises(JobError, match="checksum must be one of 'sha256', 'blake3', 'xxh3_128', not 'md5'"):
        sf.ShardJob(lambda s: s, "a.tar", "b.tar", checksum="md5")
    monkeypatch.setitem(sys.modules, "blake3", None)  # as if the package were not installed
    with pytest.raises(MissingChecksum, match=r"pip install 'shardflow\[checksums\]'"):
        new_hasher("blake3")
    with pytest.raises(JobError, match="needs the 'blake3' package"):
        sf.ShardJob(lambda s: s, "a.tar", "b.tar", checksum="blake3")
