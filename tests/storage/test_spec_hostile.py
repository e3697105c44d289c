"""Hostile dataset and shard specs (issue 26 items 1, 7, 8): `${VAR}` only in the user's own words and
never printed expanded, bounded reprs of YAML alias bombs, and spec inputs that must end in a SpecError
(deep nesting, endless includes, huge numbers, brace groups naming 10^8 URLs), never a traceback."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import pytest

from shardflow.errors import ShardIOError
from shardflow.shards.spec import MAX_INCLUDES, SpecError, load_spec
from shardflow.shards.writer import TarWriter
from shardflow.storage.specs import MAX_URLS, brace_count, count, expand
from tests.support.http_server import serve_directory

SECRET = "s3cr3t-value-0123456789"


def _shard(path) -> str:
    with TarWriter(str(path)) as w:
        w.write({"__key__": "k0", "txt": b"t"})
    return str(path)


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv("SF_TEST_SECRET", SECRET)
    monkeypatch.delenv("SHARDFLOW_SPEC_VARS", raising=False)
    return SECRET


def test_remote_include_cannot_expand_a_variable(tmp_path, secret):
    """The attack of the issue: a local spec includes a remote one whose shards name ${SECRET}."""
    remote = tmp_path / "remote"
    (remote / "community").mkdir(parents=True)
    stats: dict = {}
    with serve_directory(remote, stats=stats) as base:
        (remote / "community" / "laion.yaml").write_text(
            f"dataset:\n  - shards: {base}/steal/${{SF_TEST_SECRET}}.tar\n")
        top = tmp_path / "train.yaml"
        top.write_text(f"dataset:\n  - spec: {base}/community/laion.yaml\n")
        with pytest.raises(SpecError) as info:
            load_spec(str(top))
        message = str(info.value)
        assert "${SF_TEST_SECRET}" in message and "SHARDFLOW_SPEC_VARS" in message
        assert secret not in message
        # a remote top-level spec is a stranger's too
        with pytest.raises(SpecError, match="not in an included or remote spec"):
            load_spec(f"{base}/community/laion.yaml")
        assert stats["gets"] == 2  # the two spec files; no shard URL was ever requested


def test_the_allow_list_lets_an_include_use_a_named_variable(tmp_path, secret, monkeypatch):
    shard = _shard(tmp_path / "a-0.tar")
    monkeypatch.setenv("SF_TEST_DIR", str(tmp_path))
    (tmp_path / "inc.yaml").write_text("dataset:\n  - shards: ${SF_TEST_DIR}/a-0.tar\n")
    (tmp_path / "train.yaml").write_text("dataset:\n  - spec: inc.yaml\n  - shards: ${SF_TEST_DIR}/a-0.tar\n")
    with pytest.raises(SpecError, match=r"inc.yaml, line 2: .*\$\{SF_TEST_DIR\}"):
        load_spec(str(tmp_path / "train.yaml"))
    monkeypatch.setenv("SHARDFLOW_SPEC_VARS", "OTHER, SF_TEST_DIR")
    assert load_spec(str(tmp_path / "train.yaml")).urls == [shard, shard]


def test_errors_print_the_variable_not_its_value(tmp_path, secret):
    """The user's own spec may use ${VAR}; a message about it shows `${VAR}`, never the value."""
    (tmp_path / "train.yaml").write_text(f"dataset:\n  - shards: {tmp_path}/${{SF_TEST_SECRET}}-*.tar\n")
    with pytest.raises(SpecError) as info:
        load_spec(str(tmp_path / "train.yaml"))
    assert "${SF_TEST_SECRET}" in str(info.value) and secret not in str(info.value)
    with pytest.raises(ShardIOError) as info:
        expand(f"{tmp_path}/${{SF_TEST_SECRET}}-*.tar")
    assert "${SF_TEST_SECRET}" in str(info.value) and secret not in str(info.value)


def test_shard_dataset_and_cli_refuse_the_remote_variable(tmp_path, secret):
    from shardflow import ShardDataset

    (tmp_path / "inc.yaml").write_text("dataset:\n  - shards: http://127.0.0.1:9/steal/${SF_TEST_SECRET}.tar\n")
    (tmp_path / "train.yaml").write_text("dataset:\n  - spec: inc.yaml\n")
    with pytest.raises(SpecError) as info:
        ShardDataset(str(tmp_path / "train.yaml"))
    assert secret not in str(info.value)
    run = subprocess.run([sys.executable, "-m", "shardflow", "ls", str(tmp_path / "train.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "${SF_TEST_SECRET}" in run.stderr
    assert secret not in run.stderr + run.stdout and "Traceback" not in run.stderr


def _alias_bomb(levels: int) -> str:
    lines = ["dataset:", "  - [&l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"     , &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "]\n"


def test_alias_bomb_error_is_built_in_bounded_memory(tmp_path):
    """A ~700-byte spec whose collection is 10^7 shared leaves: the message's repr stays small."""
    (tmp_path / "bomb.yaml").write_text(_alias_bomb(7))
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match="a collection is a mapping") as info:
            load_spec(str(tmp_path / "bomb.yaml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(str(info.value)) < 400
    assert peak < 20 << 20  # the full repr would be ~50 MB of text


@pytest.mark.parametrize("body, message", [
    ("dataset:\n  - shards: {a}\n    weight: .inf\n", "weight must be at most"),
    ("dataset:\n  - shards: {a}\n    weight: 1.0e+308\n", "weight must be at most"),
    ("dataset:\n  - shards: {a}\n    weight: .nan\n", "weight must be a number > 0"),
    ("dataset:\n  - shards: {a}\n    repeat: .inf\n", "repeat must be at most"),
    ("dataset:\n  - shards: {a}\n    repeat: [1, .inf]\n", "repeat must be at most"),
    ("dataset:\n  - shards: {a}\nepoch: 1000000000000000000000\n", "epoch must be an integer from 1"),
    ("dataset:\n  - shards: " + "[" * 20000 + "\n", "nested too deeply"),
    ("dataset:\n  - shards: x-{a,b}{a,b}{c,d}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}.tar\n",
     f"more than {MAX_URLS:,} shards"),
    ("dataset:\n  - shards: x-{a,b.tar\n", "unbalanced braces"),
    ("dataset:\n  - shards: 'x" + "{a," * 200 + "b" + "}" * 200 + "'\n", "nests brace groups deeper"),
    ("dataset:\n  - spec: [1, 2]\n", "'spec' must be the name"),
])
def test_hostile_inputs_are_spec_errors(tmp_path, body, message):
    a = _shard(tmp_path / "a-0.tar")
    (tmp_path / "train.yaml").write_text(body.replace("{a}", a))
    with pytest.raises(SpecError, match="train.yaml") as info:
        load_spec(str(tmp_path / "train.yaml"))
    assert message in str(info.value)


def test_endless_remote_includes_stop_at_the_cap(tmp_path):
    """Each spec includes the next (a server could make them up forever): depth and count are capped."""
    served = tmp_path / "served"
    served.mkdir()
    for i in range(40):
        (served / f"s{i}.yaml").write_text(f"dataset:\n  - spec: s{i + 1}.yaml\n")
    with serve_directory(served) as base:
        with pytest.raises(SpecError, match="includes nested deeper than 16"):
            load_spec(f"{base}/s0.yaml")
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "leaf.yaml").write_text(f"dataset:\n  - shards: {_shard(tmp_path / 'a-0.tar')}\n")
    (wide / "mid.yaml").write_text("dataset:\n" + "  - spec: leaf.yaml\n" * 30)
    (wide / "top.yaml").write_text("dataset:\n" + "  - spec: mid.yaml\n" * 30)
    with pytest.raises(SpecError, match=f"more than {MAX_INCLUDES} spec files"):
        load_spec(str(wide / "top.yaml"))


def test_brace_groups_are_counted_not_expanded():
    assert brace_count("x-{a,b}{c,{d,e}{1..3}}.tar") == 14
    spec = "x-" + "{0,1,2,3,4,5,6,7,8,9}" * 8 + ".tar"  # 10^8 names
    with pytest.raises(ShardIOError, match="more than"):
        expand(spec)
    with pytest.raises(ShardIOError, match="more than"):
        count(spec)
    assert count("x-{00000000..99999999}.tar") == 10**8  # numeric ranges are counted, never held


def test_webdataset_spellings(tmp_path):
    a = _shard(tmp_path / "a-0.tar")
    b = _shard(tmp_path / "b-0.tar")
    (tmp_path / "wds.yaml").write_text(
        f"prefix: {tmp_path}/\ndatasets:\n  - shards: a-0.tar\n    scaleprob: 0.3\n"
        f"  - shards: b-0.tar\n    probability: 0.7\n    scale: 2\n")
    spec = load_spec(str(tmp_path / "wds.yaml"))
    assert [c.urls for c in spec.collections] == [(a,), (b,)]
    assert [c.weight for c in spec.collections] == [0.3, 0.7] and spec.collections[1].repeat == (2.0, 2.0)
    (tmp_path / "bad.yaml").write_text(f"datasets:\n  - shards: {a}\n    resample: 10\n")
    with pytest.raises(SpecError, match="line 2: webdataset's 'resample' .* write 'repeat:'"):
        load_spec(str(tmp_path / "bad.yaml"))
    (tmp_path / "both.yaml").write_text(f"dataset:\n  - shards: {a}\n    weight: 1\n    scaleprob: 2\n")
    with pytest.raises(SpecError, match="give one of them"):
        load_spec(str(tmp_path / "both.yaml"))


def test_webdataset_rewrite_and_cache_variables(tmp_path, monkeypatch):
    from shardflow.reader.settings import ReaderOptions, ReaderSettings
    from shardflow.storage.locate import resolve

    monkeypatch.delenv("SHARDFLOW_REWRITE", raising=False)
    monkeypatch.setenv("WDS_REWRITE", f"s3://old/={tmp_path}/")
    assert resolve("s3://old/a-0.tar") == f"{tmp_path}/a-0.tar"
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WDS_CACHE_SIZE", "1e9")
    settings = ReaderSettings.from_options(ReaderOptions())
    assert (settings.cache_dir, settings.cache_size) == (str(tmp_path / "cache"), 10**9)
    explicit = ReaderSettings.from_options(ReaderOptions(cache_dir="/x", cache_size="5GB"))
    assert (explicit.cache_dir, explicit.cache_size) == ("/x", "5GB")
