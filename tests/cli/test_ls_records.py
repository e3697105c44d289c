"""`shardflow ls` on record streams (issue 26, item 2): native values (ints, lists) list with the size
of their text form and their type, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.shards.records import encode_record


@pytest.mark.parametrize("suffix, fmt", [(".cbors", "cbor"), (".mps", "msgpack")])
def test_ls_lists_native_values_of_a_record_stream(tmp_path, suffix, fmt):
    shard = tmp_path / f"r{suffix}"
    shard.write_bytes(encode_record({"__key__": "1", "txt": b"hi", "cls": 3}, fmt)
                      + encode_record({"__key__": "2", "txt": b"yo", "tags": [1, 2]}, fmt))
    result = CliRunner().invoke(main, ["ls", str(shard)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["1\tcls:1(int) txt:2", "2\ttags:6(list) txt:2"]
    result = CliRunner().invoke(main, ["ls", "--json", str(shard)], catch_exceptions=False)
    first = json.loads(result.stdout.splitlines()[0])
    assert first["members"] == {"cls": 1, "txt": 2} and first["native"] == {"cls": "int"}
