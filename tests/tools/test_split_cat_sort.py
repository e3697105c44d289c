"""`shardflow split`, `cat -o`, `cat` (print), `head` and `sort`: real shards, read back with real tar."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardflow as sf
from shardflow.cli import main
from shardflow.tools.sort import SortSamples


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def make(folder: Path, shards: int = 3, per: int = 10) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with sf.TarWriter(str(folder / f"in-{s:03d}.tar")) as w:
            for i in range(per):
                n = s * per + i
                w.write({"__key__": f"k/{n:05d}", "txt": b"x" * (100 + n), "cls": b"%d" % ((7 * n) % 5),
                         "json": json.dumps({"label": (7 * n) % 4, "name": f"n{n}"}).encode()})
    return str(folder / f"in-{{000..{shards - 1:03d}}}.tar")


def keys(path: Path | str) -> list[str]:
    return [s["__key__"] for s in sf.read_samples(str(path))]


def all_samples(spec: str) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__url__"} for url in sf.expand(spec) for s in sf.read_samples(url)]


def test_split_by_count_and_size_is_resumable_and_byte_exact(tmp_path):
    spec = make(tmp_path / "in")
    out = tmp_path / "split"
    result = run("split", spec, "-o", out / "{name}-{part:03d}.tar", "--maxcount", 4, "-b", "serial")
    assert result.exit_code == 0, result.output
    parts = sorted(out.glob("*.tar"))
    assert [p.name for p in parts][:3] == ["in-000-000.tar", "in-000-001.tar", "in-000-002.tar"] and len(parts) == 9
    assert [len(keys(p)) for p in parts[:3]] == [4, 4, 2]
    assert all_samples(str(out / "*.tar")) == all_samples(spec)  # same bytes, same order
    names = subprocess.run(["tar", "-tf", str(parts[0])], capture_output=True, text=True, check=True).stdout.split()
    assert names == ["k/00000.cls", "k/00000.json", "k/00000.txt"] + [f"k/0000{i}.{e}" for i in (1, 2, 3)
                                                                     for e in ("cls", "json", "txt")]
    again = run("split", spec, "-o", out / "{name}-{part:03d}.tar", "--maxcount", 4, "-b", "serial")
    assert again.exit_code == 0 and "(3 already done before)" in again.output
    by_size = run("split", spec, "-o", tmp_path / "s2" / "{name}-{part}.tar", "--maxsize", 5000, "-b", "serial")
    assert by_size.exit_code == 0, by_size.output
    assert all(p.stat().st_size <= 5000 for p in (tmp_path / "s2").glob("*.tar"))
    assert run("split", spec, "-o", tmp_path / "x" / "{name}.tar").exit_code == 2  # needs a size


def test_cat_concatenates_in_order_or_prints_as_before(tmp_path):
    spec = make(tmp_path / "in")
    result = run("cat", spec, "-o", tmp_path / "all.tar", "--backend", "serial")
    assert result.exit_code == 0, result.output
    assert all_samples(str(tmp_path / "all.tar")) == all_samples(spec)
    with tarfile.open(tmp_path / "all.tar") as tar:  # a plain tar
        assert len(tar.getnames()) == 90
    printed = run("cat", str(tmp_path / "in" / "in-001.tar"), "--key", "k/00012", "--ext", "cls")
    assert printed.exit_code == 0 and printed.stdout_bytes == b"4"
    everything = run("cat", spec, "-e", "cls")
    assert everything.stdout_bytes == b"".join(b"%d" % ((7 * n) % 5) for n in range(30))
    assert run("cat", spec, "-o", tmp_path / "y.tar", "--key", "k/1").exit_code == 2


def test_head_copies_the_first_samples_and_stops_reading(tmp_path):
    spec = make(tmp_path / "in")
    (tmp_path / "in" / "in-002.tar").write_bytes(b"garbage" * 100)  # never reached
    result = run("head", spec, "-n", 13, "-o", tmp_path / "head.tar")
    assert result.exit_code == 0, result.output
    assert keys(tmp_path / "head.tar") == [f"k/{n:05d}" for n in range(13)]
    assert all_samples(str(tmp_path / "head.tar")) == all_samples(spec.replace("002", "001"))[:13]
    short = run("head", str(tmp_path / "in" / "in-000.tar"), "-n", 50, "-o", tmp_path / "short.tar")
    assert short.exit_code == 0 and "holds only 10" in short.output


def test_head_of_a_bad_shard_fails_cleanly_and_leaves_nothing(tmp_path):
    make(tmp_path / "in", shards=1)
    bad = tmp_path / "in" / "in-000.tar"
    bad.write_bytes(bad.read_bytes()[:3000])
    result = run("head", bad, "-n", 100, "-o", tmp_path / "out" / "h.tar")
    assert result.exit_code == 1
    assert "in-000.tar" in result.output and "truncated" in result.output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("memory", [10**9, 900])  # in memory / spilled in runs of a few samples
def test_sort_by_field_is_stable_and_external(tmp_path, memory):
    spec = make(tmp_path / "in", shards=2, per=15)
    out = tmp_path / f"sorted-{memory}"
    result = run("sort", spec, "-o", out / "{name}.tar", "--by", "json.label", "--memory", memory, "-b", "serial")
    assert result.exit_code == 0, result.output
    for shard in ("in-000", "in-001"):
        original = [s for s in sf.read_samples(str(tmp_path / "in" / f"{shard}.tar"))]
        expected = sorted(original, key=lambda s: json.loads(s["json"])["label"])  # Python's sort is stable
        got = list(sf.read_samples(str(out / f"{shard}.tar")))
        assert [s["__key__"] for s in got] == [s["__key__"] for s in expected]
        assert [s["txt"] for s in got] == [s["txt"] for s in expected]
    down = run("sort", spec, "-o", tmp_path / "down" / "{name}.tar", "--by", "cls", "--reverse", "-b", "serial")
    assert down.exit_code == 0
    labels = [int(s["cls"]) for s in sf.read_samples(str(tmp_path / "down" / "in-000.tar"))]
    assert labels == sorted(labels, reverse=True)


def test_sort_spills_runs_to_disk_past_the_memory_budget(tmp_path):
    samples = [{"__key__": f"k{i:03d}", "__url__": "u", "txt": bytes([65 + (i * 7) % 26]) * 50} for i in range(40)]
    spill = tmp_path / "spill"
    spill.mkdir()
    seen_runs = []
    sorter = SortSamples("txt", memory=400, tmpdir=str(spill))
    stream = sorter.arrange_samples(iter(samples))
    first = next(stream)
    seen_runs = [p for d in spill.iterdir() for p in d.glob("run-*.pkl")]
    rest = list(stream)
    assert len(seen_runs) == 5  # 40 samples of 50 bytes in runs of 400 bytes
    got = [first, *rest]
    assert [s["__key__"] for s in got] == [s["__key__"] for s in sorted(samples, key=lambda s: s["txt"])]
    assert not list(spill.iterdir())  # runs removed


def test_sort_by_bad_json_names_shard_and_key(tmp_path):
    with sf.TarWriter(str(tmp_path / "bad.tar")) as w:
        w.write({"__key__": "a", "json": b'{"label": 1}'})
        w.write({"__key__": "b", "json": b"{not json"})
    result = run("sort", tmp_path / "bad.tar", "-o", tmp_path / "o" / "{name}.tar", "--by", "json.label",
                 "-b", "serial", "--on-error", "raise")  # under skip (the default) the sample is dropped, logged
    assert result.exit_code == 1
    assert "key 'b'" in result.output and "not valid JSON" in result.output
    assert not (tmp_path / "o" / "bad.tar").exists()
