"""Hostile shards, round 2 (issue 26, item 18): a run of chained GNU long-name headers is one damage
report, not one per pair; a CBOR bignum over 4,300 digits fails no shard (Python refuses to print
such an int in decimal) and every message about it names shard and key."""

from __future__ import annotations

import io
import tarfile
import warnings

import cbor2

from shardflow.errors import FormatError, SampleError, ShardflowError, ShardflowWarning
from shardflow.shards.records import encode_record, read_records, value_bytes
from shardflow.shards.samples import read_samples
from tests.support.tar_corruption import tar_of


def _long_name_header(name: bytes) -> bytes:
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, len(name) + 1
    return info.tobuf(tarfile.GNU_FORMAT) + name + b"\0" + bytes(-(len(name) + 1) % 512)


def test_chained_long_name_headers_are_one_damage_report():
    head = tar_of([("a.cls", b"0")])[:1024]  # a member, no end marker
    data = head + _long_name_header(b"x" * 10) * 5000 + tar_of([("b.cls", b"1"), ("c.cls", b"2")])
    errors: list[ShardflowError] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardflowWarning)
        out = [s["__key__"] for s in read_samples(io.BytesIO(data), "mem://c.tar", on_error="skip",
                                                  report=errors.append)]
    assert out == ["c"]
    regions = [e for e in errors if isinstance(e, FormatError)]
    assert len(regions) == 1 and regions[0].offset == 2048 and "two in a row" in regions[0].reason
    assert {e.key for e in errors if isinstance(e, SampleError)} == {"a", "b", "x" * 10}


def _records(*items) -> bytes:
    return b"".join(cbor2.dumps(item) for item in items)


def test_a_cbor_bignum_over_4300_digits_reads_and_prints_exactly():
    big = 10**5000
    data = _records({"__key__": "a", "cls": 1}, {"__key__": "b", "cls": big}, {"__key__": "c", "cls": 2})
    out = list(read_records(io.BytesIO(data), "mem://r.cbors", on_error="raise"))
    assert [s["__key__"] for s in out] == ["a", "b", "c"] and out[1]["cls"] == big
    assert int(value_bytes(big), 16) == big  # `cat` prints it in hex: exact, and no ValueError
    assert encode_record(out[1], "cbor")  # and it is written back


def test_a_bignum_where_a_key_or_name_belongs_is_a_one_line_error_naming_the_shard():
    big = 10**5000
    for bad, key in (({"__key__": big, "txt": b"x"}, None), ({"__key__": "b", big: b"x"}, "b")):
        data = _records({"__key__": "a", "txt": b"a"}, bad, {"__key__": "c", "txt": b"c"})
        errors: list[ShardflowError] = []
        out = [s["__key__"] for s in read_records(io.BytesIO(data), "mem://r.cbors", on_error="skip",
                                                  report=errors.append)]
        assert out == ["a", "c"] and len(errors) == 1
        assert errors[0].url == "mem://r.cbors" and errors[0].key == key and "<int of 16610 bits>" in str(errors[0])
