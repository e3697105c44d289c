"""Jobs writing compressed shards: the output's name says the compression and the stored file is that
(checked by the real xz/bzip2/zstd and GNU tar), reruns are byte-identical, receipts hash the stored
bytes; a name shardflow cannot write (`.tar.lz4`, `.tar.zst` without the zstd extra) is refused at plan
time in one line, before anything is written; compressed shards count as shards for the guards."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, keys_in, make_shards, sha256_file, spec

pytest.importorskip("zstandard", reason="the zstd extra (pip install 'shardflow[zstd]') is part of the test install")

TOOLS = {".tar.xz": "xz", ".txz": "xz", ".tar.bz2": "bzip2", ".tbz2": "bzip2", ".tar.zst": "zstd", ".tzst": "zstd",
         ".tar.gz": "gzip"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 5)
    return directory


def _copy(sample):
    return sample


def _tested_by_tools(path, suffix: str) -> None:
    for name in (TOOLS[suffix], "tar"):
        if shutil.which(name) is None:
            pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")
    subprocess.run([TOOLS[suffix], "-t", "-q", str(path)], check=True)
    listing = subprocess.run(["tar", "-tf", str(path)], check=True, capture_output=True, text=True).stdout.split()
    assert listing == [f"{s['__key__']}.{ext}" for s in read_samples(str(path)) for ext in ("jpg", "json")]


@pytest.mark.parametrize("suffix", list(TOOLS))
def test_a_job_writes_what_the_output_name_says(shards, tmp_path, suffix):
    stored = []
    for run in ("a", "b"):
        report = sf.ShardJob(_copy, spec(shards, "in", 2), str(tmp_path / run / f"{{name}}{suffix}")).run("serial")
        assert report.ok
        files = sorted((tmp_path / run).glob(f"*{suffix}"))
        assert [p.name for p in files] == [f"in-00000{i}{suffix}" for i in range(2)]
        for path in files:
            _tested_by_tools(path, suffix)
        receipts = {s["url"].rsplit("/", 1)[-1]: s["sha256"] for s in report.shards}
        assert receipts == {p.name: sha256_file(p) for p in files}  # the receipt hashes the bytes stored
        assert sum(keys_in(files).values()) == 10
        stored.append([p.read_bytes() for p in files])
    assert stored[0] == stored[1]  # byte-identical reruns


def test_the_cli_reshards_into_tar_xz(shards, tmp_path):
    done = cli("run", "reshard", "-i", spec(shards, "in", 2), "-o", str(tmp_path / "out" / "{name}.tar.xz"),
               "-b", "serial")
    assert done.returncode == 0, done.stderr
    for path in sorted((tmp_path / "out").glob("*.tar.xz")):
        _tested_by_tools(path, ".tar.xz")


@pytest.mark.parametrize("name", ["{name}.tar.lz4", "{name}.tar.Z", "x-{task}.tlz"])
def test_a_compression_it_cannot_write_is_refused_at_plan_time(shards, tmp_path, name):
    job = sf.ShardJob(_copy, spec(shards, "in", 2), str(tmp_path / "out" / name))
    with pytest.raises(JobError, match=r"output '.*' shardflow cannot write|cannot write '\.") as info:
        job.plan()
    assert "\n" not in str(info.value) and "it writes .tar, .tar.gz" in str(info.value)
    with pytest.raises(JobError):  # a fixed list of outputs too
        sf.ShardJob(_copy, spec(shards, "in", 2), [str(tmp_path / f"o{i}.tar.lz4") for i in range(2)]).plan()
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_tar_lz4_before_the_run_starts(shards, tmp_path):
    done = cli("run", "reshard", "-i", spec(shards, "in", 2), "-o", str(tmp_path / "out" / "{name}.tar.lz4"),
               "-b", "serial")
    assert done.returncode == 2
    assert "cannot write '.tar.lz4' shards" in done.stderr and "in-000000.tar.lz4" in done.stderr
    assert not (tmp_path / "out").exists()  # no shard, no run directory


_NO_ZSTD = """
import sys
sys.modules["zstandard"] = None  # this interpreter has no zstandard: import fails
import shardflow as sf
from shardflow.errors import JobError
try:
    sf.ShardJob(lambda s: s, sys.argv[1], sys.argv[2]).plan()
except JobError as exc:
    print(exc)
"""


def test_tar_zst_without_the_extra_is_refused_at_plan_time(shards, tmp_path):
    out = tmp_path / "out" / "{name}.tar.zst"
    done = subprocess.run([sys.executable, "-c", _NO_ZSTD, spec(shards, "in", 2), str(out)], capture_output=True,
                          text=True, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and "in-000000.tar.zst" in lines[0] and "pip install 'shardflow[zstd]'" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_foreign_compressed_shard_under_a_planned_name_is_not_overwritten(shards, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "in-000000.tar.xz").write_bytes(b"someone else's shard")
    job = sf.ShardJob(_copy, spec(shards, "in", 2), str(out / "{name}.tar.xz"))
    with pytest.raises(JobError, match="in-000000.tar.xz in .* already exists"):
        job.run("serial")
    assert (out / "in-000000.tar.xz").read_bytes() == b"someone else's shard"
