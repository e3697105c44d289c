"""`shardflow index` counts what the reader reads (read_samples, the reader's own rule): a member of no
sample does not stop a shard from getting a manifest, --on-error skip counts what a reader that skips bad
samples delivers, and a failure whose cause is in the data does not advise a rerun."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from click.testing import CliRunner

from shardflow import ShardDataset
from shardflow.cli import main
from shardflow.reader.index import run_index, targets
from tests.support.tar_corruption import tar_of


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_INDEX_STATE", str(tmp_path / "state"))


def _with_link(path) -> None:
    """s0..s3, a symbolic link s4.txt (a bad sample: the reader leaves it out), s5."""
    with tarfile.open(path, "w") as tar:
        for key in ("s0", "s1", "s2", "s3", "link", "s5"):
            info = tarfile.TarInfo(f"{key}.txt")
            if key == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
                continue
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))


def _counted(tmp_path) -> list[int]:
    return [e["nsamples"] for e in json.loads((tmp_path / "_shardflow" / "summary.json").read_text())["shards"]]


def test_a_stray_member_does_not_stop_the_manifest(tmp_path):
    (tmp_path / "bad.tar").write_bytes(tar_of([(f"s{i}.txt", b"%d" % i) for i in range(5)]
                                              + [("noext", b"N"), ("s5.txt", b"5")]))
    outcome = run_index(targets([str(tmp_path / "bad.tar")]))
    assert not outcome.failed and outcome.written and _counted(tmp_path) == [6]
    assert outcome.left_out[0][1] == 1 and "'noext'" in outcome.left_out[0][2]


def test_a_bad_sample_fails_without_rerun_advice_and_skip_counts_what_the_reader_reads(tmp_path):
    _with_link(tmp_path / "link.tar")
    failed = CliRunner().invoke(main, ["index", str(tmp_path / "link.tar"), "-p", "1"])
    assert failed.exit_code != 0 and "symbolic link" in failed.output
    assert "the cause is in the data" in failed.output and "--on-error skip" in failed.output
    assert "rerun the same command" not in failed.output
    done = CliRunner().invoke(main, ["index", str(tmp_path / "link.tar"), "-p", "1", "--on-error", "skip"])
    assert done.exit_code == 0, done.output
    with pytest.warns(Warning):
        read = sum(1 for _ in ShardDataset(str(tmp_path / "link.tar")))
    assert _counted(tmp_path) == [read] == [5]
