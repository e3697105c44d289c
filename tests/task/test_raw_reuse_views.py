"""Raw-bytes reuse (task/process.py: unchanged_values, reuse_raw) under a dataset spec's view.

A value fn passes through untouched is written as the bytes it was decoded FROM. Under a view (job/
inputs.py ViewingDecoder: `rename`, `extensions`) the decoded name is not the raw member's name: after
`rename: {a.json: b.json}` the decoded `b.json` comes from the shard's `a.json`. Reuse used to look up
the raw member of the same name and wrote the shard's own `b.json`, the entry the rename discarded.
Both processors (per sample, batched) build their reuse table with this one function.
"""

from __future__ import annotations

import pytest

from shardflow.codecs import Decoder
from shardflow.job.inputs import ViewingDecoder
from shardflow.shards.spec import load_spec
from shardflow.task.process import reuse_raw, unchanged_values

URL = "/data/in-000.tar"
RAW = {"__key__": "s0", "__url__": URL, "a.json": b'{"a":  1}', "b.json": b'{"b":  2}', "txt": b"t"}


def _decoder(rename: dict[str, str], inner: Decoder | None) -> ViewingDecoder:
    (collection,) = load_spec({"dataset": [{"shards": URL, "rename": rename}]}).collections
    return ViewingDecoder({URL: collection}, inner)


@pytest.mark.parametrize("inner", [None, Decoder("rgb8")], ids=["raw", "decoded"])
@pytest.mark.parametrize("rename, expected", [
    ({"a.json": "b.json"}, {"b.json": RAW["a.json"], "txt": b"t"}),
    ({"a.json": "b.json", "b.json": "a.json"}, {"a.json": RAW["b.json"], "b.json": RAW["a.json"], "txt": b"t"}),
], ids=["into an existing name", "swap"])
def test_passed_through_values_keep_the_bytes_they_came_from(inner, rename, expected):
    decoder = _decoder(rename, inner)
    decoded = decoder(dict(RAW))
    reused = reuse_raw(dict(decoded), unchanged_values(RAW, decoded, decoder))
    assert {k: v for k, v in reused.items() if not k.startswith("__")} == expected


def test_a_value_moved_to_another_name_is_not_reused():
    """Reuse is by name as the decoded sample has it: a value fn puts under another name is encoded."""
    decoder = Decoder("rgb8")
    decoded = decoder(dict(RAW))
    out = {"__key__": "s0", "c.json": decoded["a.json"], "b.json": decoded["b.json"]}
    reused = reuse_raw(out, unchanged_values(RAW, decoded, decoder))
    assert reused["c.json"] == {"a": 1} and reused["b.json"] == RAW["b.json"]
