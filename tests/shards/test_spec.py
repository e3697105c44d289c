"""Dataset specs (YAML / JSON / dict): loading, includes, and the errors that name file and line."""

from __future__ import annotations

import json

import pytest

from shardflow.shards.spec import SpecError, is_spec, load_spec
from shardflow.shards.writer import TarWriter


def _shards(folder, name, nshards=2, n=3):
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(nshards):
        with TarWriter(str(folder / f"{name}-{s}.tar")) as w:
            for i in range(n):
                w.write({"__key__": f"{name}{s}_{i}", "nrm.jpg": b"j", "cls": b"1", "txt": b"t"})
    return str(folder / f"{name}-{{0..{nshards - 1}}}.tar")


def test_load_yaml_json_dict_and_includes(tmp_path):
    a = _shards(tmp_path / "data", "a")
    b = _shards(tmp_path / "data", "b", nshards=3)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "other.json").write_text(json.dumps({"dataset": [{"shards": b, "weight": 1}, {"shards": a, "weight": 3}]}))
    (tmp_path / "train.yaml").write_text(
        f"dataset:\n"
        f"  - shards: {a}\n    weight: 0.3\n    extensions: nrm.jpg cls\n    rename: {{nrm.jpg: jpg}}\n"
        f"  - spec: sub/other.json\n    weight: 0.2\n"
        f"  - shards: {b}\n    repeat: [1.0, 3.0]\n"
        f"epoch: 1000\n"
    )
    spec = load_spec(str(tmp_path / "train.yaml"))
    assert spec.epoch == 1000
    assert [len(c.urls) for c in spec.collections] == [2, 3, 2, 3]
    assert [c.weight for c in spec.collections] == [0.3, pytest.approx(0.05), pytest.approx(0.15), None]
    assert spec.collections[3].repeat == (1.0, 3.0)
    first = spec.collections[0]
    assert first.view({"__key__": "k", "nrm.jpg": b"j", "cls": b"1", "txt": b"t"}) == \
        {"__key__": "k", "jpg": b"j", "cls": b"1"}
    assert "train.yaml, line 2" in first.where
    same = load_spec({"dataset": [{"shards": a}]})
    assert same.collections[0].urls == spec.collections[0].urls
    assert is_spec("x/train.yaml") and is_spec({"dataset": []}) and not is_spec("x-{0..3}.tar")


@pytest.mark.parametrize("body, message", [
    ("dataset:\n  - shards: {a}\n    wieght: 2\n", "line 2: unknown field 'wieght' (did you mean 'weight'?)"),
    ("dataset:\n  - shards: {a}\n  - shards: {a}\n    weight: 0\n", "line 3: weight must be a number > 0"),
    ("dataset:\n  - shards: {a}\n    weight: -1\n", "line 2: weight must be a number > 0"),
    ("dataset:\n  - spec: missing.yaml\n", "line 2: cannot read spec"),
    ("dataset:\n  - shards: {empty}/*.tar\n", "line 2: glob"),
    ("dataset:\n  - shards: []\n", "line 2: 'shards' must be"),
    ("dataset: []\n", "'dataset' must be a non-empty list"),
    ("datasetz:\n  - shards: {a}\n", "line 1: unknown field 'datasetz' (did you mean 'dataset'?)"),
    ("dataset:\n  - spec: train.yaml\n", "includes itself"),
    ("dataset:\n  - shards: {a}\n    repeat: [3, 1]\n", "low end above"),
])
def test_errors_name_file_and_line(tmp_path, body, message):
    a = _shards(tmp_path / "data", "a")
    (tmp_path / "empty").mkdir()
    path = tmp_path / "train.yaml"
    path.write_text(body.format(a=a, empty=tmp_path / "empty"))
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    assert message in str(info.value)
    assert str(path) in str(info.value) or "missing.yaml" in str(info.value)


def test_rewrite_loop_is_a_spec_error(tmp_path, monkeypatch):
    (tmp_path / "train.yaml").write_text("dataset:\n  - shards: s3://loop/a-{0..1}.tar\n")
    monkeypatch.setenv("SHARDFLOW_REWRITE", "s3://loop/=s3://loop/again/")
    with pytest.raises(SpecError, match=r"train.yaml, line 2: .*rewrite rules loop"):
        load_spec(str(tmp_path / "train.yaml"))
