"""ReaderOptions: ShardDataset's options written once, and every one of them reaching the workers.

ShardDataset's keywords, signature and unknown-keyword check derive from the ReaderOptions fields; these
tests hold that together: the signature shows every field with its default, an unknown keyword is
refused by name, and a non-default value of EVERY field reaches the settings a DataLoader worker gets
(a pickled copy of the dataset: what spawn/forkserver workers receive, and what copy.copy goes through).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
from typing import Any, NamedTuple

import pytest

pytest.importorskip("torch")

import shardflow.codecs.gpu as gpu_codecs  # noqa: E402
from shardflow import ShardDataset  # noqa: E402
from shardflow.reader.settings import OPTION_NAMES, ORDER_OPTIONS, ReaderOptions, ReaderSettings  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402

EXPLICIT = ("manifest", "rewrite", "mirror")  # ShardDataset's keywords that are not options


def _collate(batch: list[Any]) -> Any:
    return batch


def _map(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


class Row(NamedTuple):
    value: Any  # a non-default value of the option
    setting: str  # the ReaderSettings field it reaches
    expected: Any  # that field's value (resolved)
    extra: dict[str, Any] = {}  # what else the value needs to be accepted


# one row per ReaderOptions field: a new field must be added here (test_table_covers_every_option)
NON_DEFAULT: dict[str, Row] = {
    "decode": Row("pil", "decode", "pil"),
    "only": Row(("jpg", "cls"), "only", ("jpg", "cls")),
    "allow_pickle": Row(True, "allow_pickle", True),
    "shuffle": Row(True, "shuffle", 1000),  # the shorthand, resolved
    "shardshuffle": Row(True, "shardshuffle", True),
    "batch_size": Row(4, "batch_size", 4),
    "partial": Row(False, "partial", False),
    "collate": Row(_collate, "collate_fn", _collate),
    "seed": Row(5, "seed", 5),
    "resampled": Row(True, "resampled", True),
    "epoch_size": Row(10, "epoch_size", 10),
    "equalize": Row("drop", "equalize", "drop", {"epoch_size": 10}),
    "map": Row(_map, "map", _map),
    "to_tuple": Row("jpg;png cls", "to_tuple", (("jpg", "png"), ("cls",))),
    "storage_options": Row({"auto_mkdir": True}, "storage_options", {"auto_mkdir": True}),
    "cache_dir": Row("shard-cache", "cache_dir", "shard-cache"),
    "cache_size": Row("1GB", "cache_size", "1GB"),
    "on_error": Row("raise", "on_error", "raise"),
    "split_by_node": Row(False, "split_by_node", False),
    "split_by_worker": Row(False, "split_by_worker", False),
    "rank": Row(1, "rank_world", (1, 2), {"world_size": 2}),
    "world_size": Row(3, "rank_world", (0, 3), {"rank": 0}),
    "gpu_decode": Row(True, "gpu_decode", True),  # with CUDA "available" (patched below)
    "device": Row("cpu", "device", "cpu"),
    "channels_last": Row(True, "channels_last", True),
    "allow_pipe": Row(True, "allow_pipe", True),
}


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("options")
    with ShardWriter(os.path.join(directory, "s-%03d.tar"), maxcount=10**6) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "cls": str(i).encode()})
    return os.path.join(directory, "s-000.tar")


def test_table_covers_every_option():
    assert set(NON_DEFAULT) == set(OPTION_NAMES), "add a row to NON_DEFAULT for each new ReaderOptions field"


def test_signature_lists_every_option_with_its_default():
    params = inspect.signature(ShardDataset).parameters
    assert list(params)[0] == "spec"
    assert set(params) == {"spec", *OPTION_NAMES, *EXPLICIT}
    for f in dataclasses.fields(ReaderOptions):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name
        assert params[f.name].default == f.default, f.name
    assert all(params[name].default is None for name in EXPLICIT)
    init = inspect.signature(ShardDataset.__init__).parameters
    assert list(init) == ["self", *params]
    assert all(f"- {name}=" in ShardDataset.__doc__ for name in OPTION_NAMES)  # the generated option list


def test_defaults_are_the_fields_defaults(shard):
    assert ShardDataset(shard).settings == ReaderSettings.from_options(ReaderOptions())


def test_unknown_keyword_is_refused_by_name(shard):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'shufle'; valid: spec, manifest") as e:
        ShardDataset(shard, shufle=100)
    assert "shuffle" in str(e.value) and "allow_pipe" in str(e.value)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'bogus', 'shufle'"):
        ShardDataset(shard, shufle=100, bogus=1)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_every_option_reaches_a_workers_settings(name, shard, monkeypatch):
    monkeypatch.setattr(gpu_codecs, "cuda_available", lambda: True)  # gpu_decode stays on without a GPU
    row = NON_DEFAULT[name]
    default = getattr(ShardDataset(shard).settings, row.setting)
    assert row.expected != default, f"{name}: the table's value must differ from the default"
    ds = ShardDataset(shard, **{name: row.value}, **row.extra)
    worker_copy = pickle.loads(pickle.dumps(ds))  # what a DataLoader worker gets
    assert getattr(worker_copy.settings, row.setting) == row.expected
    assert getattr(ds.settings, row.setting) == row.expected


def test_order_options_are_what_a_state_records(shard):
    # a state dict's config: changing this set makes earlier state dicts refuse to load
    assert set(ORDER_OPTIONS) == {"shuffle", "shardshuffle", "batch_size", "partial", "equalize", "epoch_size",
                                  "resampled", "split_by_node", "split_by_worker"}
    config = ShardDataset(shard, shuffle=True, batch_size=2).state_dict()["config"]
    assert set(config) == {*ORDER_OPTIONS, "counts"}
    assert config["shuffle"] == 1000 and config["shardshuffle"] is True and config["batch_size"] == 2


def test_assigning_an_option_attribute_replaces_the_settings(shard):
    ds = ShardDataset(shard)
    before = ds.settings
    ds.batch_size = 8
    assert ds.settings is not before and ds.settings.batch_size == 8 and ds.batch_size == 8
    assert before.batch_size is None
