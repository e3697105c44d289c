"""A dataset spec's view (`rename`, `extensions`) as job inputs: the job writes what fn returned.

The bug this guards against: with `rename: {a.json: b.json}` over shards that also hold `b.json`, fn saw
(and returned) the renamed value, but the job wrote the shard's ORIGINAL `b.json`, the entry the rename
had discarded: the raw-bytes reuse (values fn passes through are written as the input's own bytes, no
re-encode) mapped a value back to the raw member of the same NAME instead of the member it came from.
The reader on the same spec gave the renamed value, so a job and the reader disagreed. A swap
(`{a.json: b.json, b.json: a.json}`) was written back unswapped. Here every path that writes (per
sample inline and overlapped, batched, the built-in reshard) is checked against the reader's view of
the same spec file, byte for byte, and against the values fn saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardflow as sf
from shardflow.codecs import Decoder
from shardflow.job.jobfile import load_job
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter

# raw JSON with spacing a re-encode would not reproduce: reuse writes these exact bytes
A = [f'{{"from": "a",  "i": {i}}}'.encode() for i in range(3)]
B = [f'{{"from": "b",  "i": {i}}}'.encode() for i in range(3)]

RENAMES = {
    "into an existing name": "{a.json: b.json}",
    "swap": "{a.json: b.json, b.json: a.json}",
    "swap, other order": "{b.json: a.json, a.json: b.json}",
    "chain": "{a.json: b.json, b.json: c.json}",
}


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in-000.tar"
    with TarWriter(str(path)) as writer:
        for i in range(3):
            writer.write({"__key__": f"s{i}", "a.json": A[i], "b.json": B[i], "txt": b"t%d" % i})
    return path


def _spec(tmp_path: Path, shard: Path, rename: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(f"dataset:\n  - shards: {shard}\n    rename: {rename}\n")
    return str(path)


def _entries(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def _reader_view(spec: str) -> list[dict[str, Any]]:
    return [_entries(s) for s in sf.ShardDataset(spec, decode=None)]


def _written(folder: Path) -> list[dict[str, Any]]:
    return [_entries(s) for s in read_samples(str(folder / "in-000.tar"))]


class Recorder:
    """fn: returns each sample (or batch) unchanged, keeping what it was handed (serial backend)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, sample: Any) -> Any:
        self.seen.extend(sample if isinstance(sample, list) else [sample])
        return sample


@pytest.mark.parametrize("rename", RENAMES.values(), ids=list(RENAMES))
@pytest.mark.parametrize("settings", [{}, {"decode": "rgb8"}, {"decode": "rgb8", "batch_size": 2}],
                         ids=["raw", "decoded", "batched"])
def test_job_writes_what_fn_returned(shard, tmp_path, rename, settings):
    spec = _spec(tmp_path, shard, rename)
    fn = Recorder()
    report = sf.ShardJob(fn, spec, str(tmp_path / "o" / "{name}.tar"), run_dir=str(tmp_path / "run"),
                         **settings).run("serial", progress=False)
    assert report.ok and report.stats.samples_out == 3
    written = _written(tmp_path / "o")
    assert written == _reader_view(spec)  # the job and the reader agree, byte for byte
    decode = Decoder(settings["decode"]) if "decode" in settings else _entries
    assert [decode(s) for s in written] == [_entries(s) for s in fn.seen]  # the bytes of what fn returned


def test_the_rename_itself(shard, tmp_path):
    """What the view makes of the sample (the reader's rule, shards.spec.Collection.view): a rename
    into an existing name replaces it; renames apply at once (a swap swaps; key order of the YAML
    mapping does not matter)."""
    one = _reader_view(_spec(tmp_path, shard, RENAMES["into an existing name"]))
    assert one[0] == {"b.json": A[0], "txt": b"t0"}
    for name in ("swap", "swap, other order"):
        assert _reader_view(_spec(tmp_path, shard, RENAMES[name]))[1] == {"a.json": B[1], "b.json": A[1], "txt": b"t1"}
    assert _reader_view(_spec(tmp_path, shard, RENAMES["chain"]))[2] == {"b.json": A[2], "c.json": B[2], "txt": b"t2"}


def test_reshard_writes_the_renamed_samples(shard, tmp_path):
    """The built-in passthrough job (no decode) writes the view too, as the reader reads it."""
    spec = _spec(tmp_path, shard, "{a.json: b.json, b.json: a.json}")
    job = load_job("reshard", inputs=spec, outputs=str(tmp_path / "o" / "{name}.tar"), run_dir=str(tmp_path / "run"))
    assert job.run("serial", progress=False).ok
    assert _written(tmp_path / "o") == _reader_view(spec)
