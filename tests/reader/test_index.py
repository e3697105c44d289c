"""`shardflow index` (issue 29 item 4): the manifest of shards made elsewhere, where the reader finds it,
resumable; and the manifest index one load shares between a spec's collections (issue 28 item 7)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import warnings

import pytest

from shardflow.reader.index import run_index, state_path, targets
from shardflow.reader.manifest import ShardManifest
from shardflow.reader.mix import DatasetMix
from shardflow.reader.settings import ReaderOptions, ReaderSettings
from shardflow.reader.warn_once import warned


def _tar(path, n: int) -> None:
    with tarfile.open(path, "w") as tar:
        for k in range(n):
            data = f"{k}".encode()
            info = tarfile.TarInfo(f"{k:05d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_INDEX_STATE", str(tmp_path / "state"))


def test_index_writes_the_manifest_the_reader_uses_and_resumes(tmp_path, state):
    from shardflow import ShardDataset

    for i, n in enumerate((4, 9, 2)):
        _tar(tmp_path / f"s-{i}.tar", n)
    (tmp_path / "s-1.tar").write_bytes((tmp_path / "s-1.tar").read_bytes()[:1500])  # cut inside a member
    spec = str(tmp_path / "s-{0..2}.tar")
    plan = targets([spec])
    assert [t.manifest for t in plan] == [str(tmp_path / "_shardflow" / "summary.json")]
    first = run_index(plan)
    assert first.indexed == 2 and [u for u, _ in first.failed] == [str(tmp_path / "s-1.tar")]
    assert "s-1.tar" in first.failed[0][1] and not first.written  # no partial manifest
    assert not (tmp_path / "_shardflow" / "summary.json").exists()

    _tar(tmp_path / "s-1.tar", 9)  # repaired: the rerun reads only this one
    again = run_index(targets([spec]))
    assert (again.resumed, again.indexed, again.failed) == (2, 1, [])
    entries = json.loads((tmp_path / "_shardflow" / "summary.json").read_text())["shards"]
    assert [e["nsamples"] for e in entries] == [4, 9, 2]
    data = (tmp_path / "s-2.tar").read_bytes()
    assert entries[2]["nbytes"] == len(data) and entries[2]["sha256"] == hashlib.sha256(data).hexdigest()
    import os

    assert not os.path.exists(state_path(plan[0].manifest))  # the checkpoint goes once the manifest is written
    ds = ShardDataset(spec, decode=None, equalize="drop", world_size=2, rank=0)
    assert ds.counts == [4, 9, 2] and len(ds) == 7


def test_index_cli_dataset_spec_and_exit_status(tmp_path, state):
    for folder, sizes in (("a", (3, 5)), ("b", (7,))):
        (tmp_path / folder).mkdir()
        for i, n in enumerate(sizes):
            _tar(tmp_path / folder / f"x-{i}.tar", n)
    (tmp_path / "train.yaml").write_text(f"dataset:\n  - shards: {tmp_path}/a/x-{{0..1}}.tar\n"
                                         f"  - shards: {tmp_path}/b/x-0.tar\n    weight: 2\n")
    run = subprocess.run([sys.executable, "-m", "shardflow", "index", str(tmp_path / "train.yaml"), "-p", "1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for folder, sizes in (("a", [3, 5]), ("b", [7])):
        entries = json.loads((tmp_path / folder / "_shardflow" / "summary.json").read_text())["shards"]
        assert [e["nsamples"] for e in entries] == sizes
    missing = subprocess.run([sys.executable, "-m", "shardflow", "index", str(tmp_path / "a" / "x-{0..2}.tar")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "FAILED" in missing.stderr and "x-2.tar" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_collections_over_one_folder_share_one_read_manifest(tmp_path):
    """A spec of many collections over one folder: each collection gets its own shards' counts, and the
    summary is parsed once for all of them (the cache holds one index)."""
    entries = [{"url": str(tmp_path / f"in-{i:03d}.tar"), "nsamples": i + 1} for i in range(100)]
    (tmp_path / "_shardflow").mkdir()
    (tmp_path / "_shardflow" / "summary.json").write_text(json.dumps({"shards": entries}))
    cache: dict = {}
    parts = [ShardManifest.load(None, [str(tmp_path / f"in-{i:03d}.tar") for i in range(c * 10, c * 10 + 10)],
                                None, cache) for c in range(10)]
    assert [m.counts for m in parts] == [list(range(c * 10 + 1, c * 10 + 11)) for c in range(10)]
    assert len(cache) == 1
    spec = {"dataset": [{"shards": str(tmp_path / f"in-{{{c * 10:03d}..{c * 10 + 9:03d}}}.tar")} for c in range(10)]}
    mix = DatasetMix.load(spec, None, None)
    assert [sum(m.counts) for m in mix.manifests] == [sum(range(c * 10 + 1, c * 10 + 11)) for c in range(10)]


def test_repeat_without_counts_or_epoch_warns(tmp_path):
    _tar(tmp_path / "a-0.tar", 3)
    spec = {"dataset": [{"shards": str(tmp_path / "a-0.tar"), "repeat": [1.0, 3.0]}]}
    warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DatasetMix.load(spec, None, None).check(ReaderSettings.from_options(ReaderOptions()))
    assert any("'repeat'" in str(w.message) and "has no effect" in str(w.message) for w in caught)
    warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DatasetMix.load(dict(spec, epoch=10), None, None).check(ReaderSettings.from_options(ReaderOptions()))
    assert not any("has no effect" in str(w.message) for w in caught)


def test_index_on_s3_writes_the_manifest_beside_the_shards(s3_server, s3_bucket, state):
    """Any store: shards written to S3 by Python's tarfile, indexed there, found by the reader."""
    from shardflow import ShardDataset
    from shardflow.storage.schemes import open_write

    options = s3_server.storage_options
    for i, n in enumerate((3, 6)):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for k in range(n):
                info = tarfile.TarInfo(f"{i}{k:04d}.txt")
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
        with open_write(f"{s3_bucket}/plain/p-{i}.tar", options) as f:
            f.write(buffer.getvalue())
    spec = f"{s3_bucket}/plain/p-{{0..1}}.tar"
    outcome = run_index(targets([spec], options), options)
    assert outcome.written == [f"{s3_bucket}/plain/_shardflow/summary.json"] and not outcome.failed
    assert ShardDataset(spec, storage_options=options, decode=None).counts == [3, 6]


def _copy(sample):
    return sample


def test_index_keeps_a_jobs_summary_and_refuses_to_amend_it(tmp_path, state):
    """`index train.yaml` over a job's outputs replaced the job's entries in its own run directory's
    summary.json with index's (other spellings of the same URLs, appended): the job's record, rewritten."""
    import shardflow as sf
    from shardflow.errors import ShardflowError

    (tmp_path / "in").mkdir()
    for i in range(2):
        _tar(tmp_path / "in" / f"s-{i}.tar", 3 + i)
    out = tmp_path / "out"
    sf.ShardJob(_copy, inputs=str(tmp_path / "in" / "*.tar"), outputs=str(out / "{name}.tar")).run(
        backend="serial", progress=False)
    summary = out / "_shardflow" / "summary.json"
    before = summary.read_bytes()
    outcome = run_index(targets([str(out / "*.tar"), str(tmp_path / "in" / "*.tar")]))
    assert outcome.counted_by_job == [str(summary)] and outcome.indexed == 2
    assert summary.read_bytes() == before  # the job's summary, untouched
    assert (tmp_path / "in" / "_shardflow" / "summary.json").exists()  # the other folder indexed

    _tar(out / "s-9.tar", 1)  # a shard the job did not write, beside its outputs
    with pytest.raises(ShardflowError, match="does not list 1 of the 3 shards.*summary of the job run.*-o"):
        run_index(targets([str(out / "*.tar")]))
    assert summary.read_bytes() == before


def test_a_checkpoint_counts_only_the_shards_it_read(tmp_path, state, monkeypatch):
    """The checkpoint was named by the manifest as typed (`-o idx.json` in two folders: one checkpoint)
    and trusted by URL alone: a shard replaced after a failed run kept the count of the old one."""
    import os

    for folder in ("A", "B"):
        (tmp_path / folder / "data").mkdir(parents=True)
    _tar(tmp_path / "A" / "data" / "a.tar", 3)
    (tmp_path / "A" / "data" / "b.tar").write_bytes(os.urandom(3000))  # not a tar: A's run fails on it
    _tar(tmp_path / "B" / "data" / "a.tar", 1)
    _tar(tmp_path / "B" / "data" / "b.tar", 1)
    monkeypatch.chdir(tmp_path / "A")
    assert run_index(targets(["data/{a,b}.tar"], output="idx.json")).failed  # a.tar checkpointed, 3 samples
    monkeypatch.chdir(tmp_path / "B")
    outcome = run_index(targets(["data/{a,b}.tar"], output="idx.json"))
    assert (outcome.resumed, outcome.indexed) == (0, 2)
    assert [e["nsamples"] for e in json.loads((tmp_path / "B" / "idx.json").read_text())["shards"]] == [1, 1]
    assert "version" not in json.loads((tmp_path / "B" / "idx.json").read_text())["shards"][0]

    monkeypatch.chdir(tmp_path / "A")
    _tar(tmp_path / "A" / "data" / "a.tar", 2)  # replaced since the checkpoint counted it
    _tar(tmp_path / "A" / "data" / "b.tar", 1)
    outcome = run_index(targets(["data/{a,b}.tar"], output="idx.json"))
    assert (outcome.resumed, outcome.indexed) == (0, 2)
    assert [e["nsamples"] for e in json.loads((tmp_path / "A" / "idx.json").read_text())["shards"]] == [2, 1]


def test_index_needs_no_torch(tmp_path, state):
    """`shardflow index` imported shardflow.reader, whose __init__ imported torch: on the core install
    (torch is an extra) the command stopped with an ImportError traceback."""
    (tmp_path / "d").mkdir()
    _tar(tmp_path / "d" / "a.tar", 2)
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('no torch here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from shardflow.cli import main\n"
        "sys.argv = ['shardflow', 'index', sys.argv[1], '-p', '1']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d" / "a.tar")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "d" / "_shardflow" / "summary.json").read_text())["shards"][0]["nsamples"] == 2
