"""What a job writes: byte-identical reruns, serial == processes, 1:N and filters, naming and rollover."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.job.jobfile import load_job
from shardflow.shards.samples import read_samples
from tests.support.jobs import file_bytes, keys_in, make_shards, spec, tars


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 3, 6)
    return directory


def _augment(shards: Path, out: Path, **kwargs):
    return load_job("augment", inputs=spec(shards, "in", 3), outputs=str(out / "{name}.tar"),
                    overrides={"crop": 16}, **kwargs)


def test_reruns_and_backends_write_identical_bytes(shards, tmp_path):
    """augment uses sample_rng (torch): same bytes on a rerun, and from serial and processes."""
    first = _augment(shards, tmp_path / "a").run("serial")
    second = _augment(shards, tmp_path / "b").run("serial")
    third = _augment(shards, tmp_path / "c").run("processes", workers=2)
    assert first.ok and second.ok and third.ok
    a, b, c = (file_bytes(tars(tmp_path / d)) for d in "abc")
    assert len(a) == 3 and a == b == c
    assert [s["sha256"] for s in first.shards] == [s["sha256"] for s in third.shards]
    # and the job really is random per sample: another seed gives other bytes
    other = _augment(shards, tmp_path / "d", seed=1).run("serial")
    assert other.ok and file_bytes(tars(tmp_path / "d")) != a


def test_global_generators_are_seeded_per_sample(shards, tmp_path):
    """Code that calls random / numpy.random directly is reproducible too, independent of order."""
    def fn(sample):
        return {"__key__": sample["__key__"], "json": {"r": random.random(), "n": float(np.random.rand()),
                                                       "g": float(sf.sample_rng(sample).random())}}

    def run(out, inputs):
        sf.ShardJob(fn, inputs, str(out / "{name}.tar"), run_dir=str(out / "run")).run("serial")
        return {s["__key__"]: s["json"] for p in tars(out) for s in read_samples(str(p))}

    forward = run(tmp_path / "f", [str(shards / f"in-{i:06d}.tar") for i in range(3)])
    backward = run(tmp_path / "b", [str(shards / f"in-{i:06d}.tar") for i in (2, 1, 0)])
    assert forward == backward and len(forward) == 18
    assert len({v for v in forward.values()}) == 18


def test_one_to_many_and_filters(shards, tmp_path):
    def tiles(sample):
        for i in range(3):  # keys default to KEY_0, KEY_1, KEY_2
            yield {"txt": f"{sample['__key__']} tile {i}"}

    report = sf.ShardJob(tiles, spec(shards, "in", 3), str(tmp_path / "tiles" / "{name}.tar")).run("serial")
    assert report.ok and report.stats.samples_in == 18 and report.stats.samples_out == 54
    counts = keys_in(tars(tmp_path / "tiles"))
    assert set(counts) == {f"s{i:06d}_{t}" for i in range(18) for t in range(3)}

    def evens(sample):
        return sample if json.loads(sample["json"])["index"] % 2 == 0 else None

    report = sf.ShardJob(evens, spec(shards, "in", 3), str(tmp_path / "even" / "{name}.tar")).run("serial")
    assert report.ok and report.stats.dropped == 9 and report.stats.samples_out == 9
    kept = [s for p in tars(tmp_path / "even") for s in read_samples(str(p))]
    assert [s["__key__"] for s in kept] == [f"s{i:06d}" for i in range(0, 18, 2)]
    originals = {s["__key__"]: s for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))}
    assert all(s["jpg"] == originals[s["__key__"]]["jpg"] for s in kept)  # raw bytes copied as they were

    def nothing(sample):
        return None

    report = sf.ShardJob(nothing, spec(shards, "in", 3), str(tmp_path / "none" / "{name}.tar")).run("serial")
    assert report.ok and report.stats.dropped == 18 and tars(tmp_path / "none") == []  # no empty shards


def _names(out: Path) -> list[str]:
    return [str(p.relative_to(out)) for p in tars(out)]


def _copy(sample):
    return sample


@pytest.mark.parametrize("pattern, options, expected", [
    ("{task:04d}-{part:02d}.tar", dict(maxcount=4), [
        "0000-00.tar", "0000-01.tar", "0001-00.tar", "0001-01.tar", "0002-00.tar", "0002-01.tar"]),
    ("{name}.tar", dict(maxcount=4), [
        "in-000000.tar", "in-000000_001.tar", "in-000001.tar", "in-000001_001.tar", "in-000002.tar",
        "in-000002_001.tar"]),
    ("sub/{name}-p{part}.tar", dict(), ["sub/in-000000-p0.tar", "sub/in-000001-p0.tar",
                                       "sub/in-000002-p0.tar"]),
    ("big-{task}.tar", dict(inputs_per_task=2, maxcount=5), [
        "big-0.tar", "big-0_001.tar", "big-0_002.tar", "big-1.tar", "big-1_001.tar"]),
    ("{name}-{task:03d}.tar", dict(inputs_per_task=3), ["in-000000-000.tar"]),
])
def test_output_naming_patterns_and_rollover(shards, tmp_path, pattern, options, expected):
    out = tmp_path / "out"
    report = sf.ShardJob(_copy, spec(shards, "in", 3), str(out / pattern), run_dir=str(tmp_path / "run"),
                         **options).run("serial")
    assert report.ok, str(report)
    assert sorted(_names(out)) == sorted(expected)
    assert sorted(keys_in(tars(out))) == [f"s{i:06d}" for i in range(18)]
    assert sorted(Path(s["url"]).name for s in report.shards) == sorted(Path(n).name for n in expected)


def test_fixed_output_names_roll_over_by_size(shards, tmp_path):
    sizes = [len(s["jpg"]) + len(s["json"]) for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))]
    maxsize = 2 * max(sizes) + 4 * 512 + 1024  # room for two samples, never three
    outputs = [str(tmp_path / "out" / f"x-{i}.tar") for i in range(3)]
    report = sf.ShardJob(_copy, spec(shards, "in", 3), outputs, maxsize=maxsize).run("serial")
    assert report.ok
    files = tars(tmp_path / "out")
    assert all(p.stat().st_size <= maxsize for p in files)
    assert len(files) >= 6 and {p.name.split("_")[0].removesuffix(".tar") for p in files} == {"x-0", "x-1", "x-2"}
    assert sum(keys_in(files).values()) == 18


def test_bad_patterns_are_explained(shards, tmp_path):
    with pytest.raises(JobError, match=r"gives the same name '.*out-0.tar' to tasks 0 and 1: add \{task\} or \{name\}"):
        sf.ShardJob(_copy, spec(shards, "in", 3), str(tmp_path / "out-{part}.tar")).plan()
    with pytest.raises(JobError, match=r"unknown field \{shard\}; use \{task\}, \{name\}, \{part\}"):
        sf.ShardJob(_copy, spec(shards, "in", 3), str(tmp_path / "{shard}-{task}.tar")).plan()


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".cbors"])
def test_name_drops_every_shard_suffix_it_reads(suffix):
    from shardflow.job.naming import shard_stem

    assert shard_stem(f"s3://b/dir/train-000003{suffix}") == "train-000003"
