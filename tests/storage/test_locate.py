"""Spec syntax webdataset users write (`a::b`, `${VAR}`) and location independence (rewrite rules, a
mirror directory), applied where input URLs are opened."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardflow.errors import ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter
from shardflow.storage.locate import LocateError, Locator, mirror_path, parse_rules
from shardflow.storage.specs import expand


def _shard(path, n=3, tag="x"):
    with TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"{tag}{i}", "txt": f"{tag}{i}".encode()})


def test_join_lists_and_fsspec_chains(tmp_path):
    a, b = tmp_path / "a-{0..1}.tar", tmp_path / "b.tar"
    assert expand(f"{a}::{b}") == [str(tmp_path / "a-0.tar"), str(tmp_path / "a-1.tar"), str(b)]
    assert expand("simplecache::s3://bucket/k.tar") == ["simplecache::s3://bucket/k.tar"]
    assert expand(["x.tar::y.tar", "z.tar"]) == ["x.tar", "y.tar", "z.tar"]


def test_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("SF_DATA", str(tmp_path))
    assert expand("${SF_DATA}/a-{0..1}.tar") == [f"{tmp_path}/a-0.tar", f"{tmp_path}/a-1.tar"]
    monkeypatch.delenv("SF_DATA")
    with pytest.raises(ShardIOError, match="SF_DATA is not set"):
        expand("${SF_DATA}/a.tar")


def test_rewrite_rules():
    loc = Locator(parse_rules(["s3://ocr/=/data/ocr/", r"^gs://([a-z]+)-old/=gs://\1/"], "test"))
    assert loc.resolve("s3://ocr/a.tar") == "/data/ocr/a.tar"
    assert loc.resolve("gs://train-old/x/a.tar") == "gs://train/x/a.tar"
    assert loc.resolve("s3://other/a.tar") == "s3://other/a.tar"
    chained = Locator(parse_rules("a://=b://;b://=c://", "test"))
    assert chained.resolve("a://k") == "c://k"
    with pytest.raises(LocateError, match="loop: a://k -> b://k -> a://k"):
        Locator(parse_rules("a://=b://;b://=a://", "test")).resolve("a://k")
    with pytest.raises(LocateError, match="loop"):
        Locator(parse_rules(["s3://a/=s3://a/b/"], "test")).resolve("s3://a/x")
    with pytest.raises(LocateError, match="not PREFIX=REPLACEMENT"):
        parse_rules(["nothing"], "test")


def test_rewrite_from_env_and_config_applies_to_reads_only(tmp_path, monkeypatch):
    _shard(tmp_path / "real.tar", tag="r")
    config = tmp_path / "config.yaml"
    config.write_text(f"rewrite:\n  - 'virtual://data/={tmp_path}/'\n")
    monkeypatch.setenv("SHARDFLOW_CONFIG", str(config))
    assert [s["__key__"] for s in read_samples("virtual://data/real.tar")] == ["r0", "r1", "r2"]
    monkeypatch.delenv("SHARDFLOW_CONFIG")
    monkeypatch.setenv("SHARDFLOW_REWRITE", f"virtual://data/={tmp_path}/")
    samples = list(read_samples("virtual://data/real.tar"))
    assert samples[0]["__url__"] == "virtual://data/real.tar"  # samples name the URL the spec gave
    # outputs are never rewritten: a ShardWriter writes where it is told
    monkeypatch.setenv("SHARDFLOW_REWRITE", f"{tmp_path}/out=/nonexistent/out")
    with ShardWriter(str(tmp_path / "out-%d.tar")) as w:
        w.write({"__key__": "k", "txt": b"1"})
    assert (tmp_path / "out-0.tar").exists()


def test_mirror_path_layout():
    assert mirror_path("/m", "s3://bucket/a/b.tar") == "/m/bucket/a/b.tar"
    assert mirror_path("/m", "https://host:8080/x/y.tar?sig=1") == "/m/host:8080/x/y.tar"
    assert mirror_path("/m", "/local/a.tar") is None
    assert mirror_path("/m", "s3://bucket/../etc/passwd") is None


def test_mirror_reads_with_the_object_store_down(s3_server, s3_bucket, tmp_path, monkeypatch):
    options = s3_server.storage_options
    url = f"{s3_bucket}/train/s-000.tar"
    with TarWriter(url, storage_options=options) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "txt": b"remote"})
    mirror = tmp_path / "mirror"
    local = mirror_path(str(mirror), url)
    (mirror / s3_bucket[len("s3://"):] / "train").mkdir(parents=True)
    _shard(local, n=4, tag="k")
    monkeypatch.setenv("SHARDFLOW_MIRROR", str(mirror))
    s3_server.stop()
    try:
        got = list(read_samples(url, storage_options=options))
        assert [s["txt"] for s in got] == [b"k0", b"k1", b"k2", b"k3"]  # the mirror's copy
        cmd = [sys.executable, "-m", "shardflow.cli", "stats", "-v", url, "--mirror", str(mirror)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert f"{url} -> {local}" in res.stdout
    finally:
        s3_server.start()
    monkeypatch.delenv("SHARDFLOW_MIRROR")
    assert [s["txt"] for s in read_samples(url, storage_options=options)] == [b"remote"] * 4


def test_dataset_rewrite_and_mirror_arguments(tmp_path):
    import shardflow as sf

    for i in range(2):
        _shard(tmp_path / f"a-{i}.tar", tag=f"a{i}_")
    ds = sf.ShardDataset("virtual://x/a-{0..1}.tar", decode=None, rewrite=[f"virtual://x/={tmp_path}/"])
    got = list(ds)
    assert [s["__key__"] for s in got] == ["a0_0", "a0_1", "a0_2", "a1_0", "a1_1", "a1_2"]
    assert got[0]["__url__"] == "virtual://x/a-0.tar"
    mirror = tmp_path / "mirror"
    (mirror / "bucket").mkdir(parents=True)
    _shard(mirror / "bucket" / "a-0.tar", tag="m")
    ds = sf.ShardDataset(["s3://bucket/a-0.tar"], decode=None, mirror=str(mirror), manifest=False)
    assert [s["__key__"] for s in ds] == ["m0", "m1", "m2"]
    # a shard the mirror does not hold is read from where the spec says (here: nowhere)
    with pytest.raises(ShardIOError, match="memory://bucket/a-1.tar"):
        list(sf.ShardDataset(["memory://bucket/a-1.tar"], decode=None, mirror=str(mirror), manifest=False))


def test_the_locator_follows_every_source_changed_between_reads(tmp_path, monkeypatch):
    """current_locator is built once per state of its sources: a variable set, a config file rewritten
    or removed between two reads must still take effect on the next one."""
    import os

    from shardflow.storage.locate import resolve

    monkeypatch.delenv("SHARDFLOW_REWRITE", raising=False)
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("SHARDFLOW_CONFIG", str(config))
    config.write_text("rewrite:\n  - 'virtual://a/=/one/'\n")
    assert resolve("virtual://a/x.tar") == "/one/x.tar"
    config.write_text("rewrite:\n  - 'virtual://a/=/two/'\n")
    os.utime(config, ns=(0, os.stat(config).st_mtime_ns + 10**9))  # a rewrite within the same tick
    assert resolve("virtual://a/x.tar") == "/two/x.tar"
    monkeypatch.setenv("SHARDFLOW_REWRITE", "virtual://a/=/three/")
    assert resolve("virtual://a/x.tar") == "/three/x.tar"
    monkeypatch.delenv("SHARDFLOW_REWRITE")
    monkeypatch.setenv("WDS_REWRITE", "virtual://a/=/four/")
    assert resolve("virtual://a/x.tar") == "/four/x.tar"
    monkeypatch.delenv("WDS_REWRITE")
    monkeypatch.setenv("SHARDFLOW_CONFIG", str(tmp_path / "other.yaml"))
    (tmp_path / "other.yaml").write_text("{}\n")
    assert resolve("virtual://a/x.tar") == "virtual://a/x.tar"
