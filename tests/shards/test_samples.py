"""Members <-> samples: the key rule, problems reported (never merged or dropped silently), damage."""

from __future__ import annotations

import io
import json
import warnings

import pytest

from shardflow.errors import DecodeError, FormatError, SampleError, ShardflowError, ShardflowWarning
from shardflow.shards.keys import check_key, split_name
from shardflow.shards.samples import read_samples, sample_members
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_read import iter_members
from shardflow.shards.writer import TarWriter
from tests.support.tar_corruption import tar_of

URL = "file:///data/shard-000001.tar"


def shard(samples) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for s in samples:
            w.write(s)
    return buf.getvalue()


def read(data: bytes, **kw):
    return list(read_samples(io.BytesIO(data), URL, **kw))


def keys(samples) -> list[str]:
    return [s["__key__"] for s in samples]


@pytest.mark.parametrize(
    "name,key,ext",
    [
        ("000123.jpg", "000123", "jpg"),
        ("a/b/000123.seg.png", "a/b/000123", "seg.png"),
        ("a.b/c.d/000123.JPG", "a.b/c.d/000123", "jpg"),
        ("x/y", "x/y", ""),
        ("x.y/z", "x.y/z", ""),
        ("./a/1.txt", "./a/1", "txt"),
        ("d/.hidden.txt", "d/", "hidden.txt"),
        ("k.tar.gz", "k", "tar.gz"),
    ],
)
def test_split_name(name, key, ext):
    assert split_name(name) == (key, ext)


def test_grouping_and_metadata():
    data = tar_of([("a/1.cls", b"1"), ("a/1.jpg", b"J1"), ("a/2.cls", b"2"), ("a/2.jpg", b"J2"), ("b/1.txt", b"t")])
    out = read(data)
    assert out == [
        {"__key__": "a/1", "__url__": URL, "cls": b"1", "jpg": b"J1"},
        {"__key__": "a/2", "__url__": URL, "cls": b"2", "jpg": b"J2"},
        {"__key__": "b/1", "__url__": URL, "txt": b"t"},
    ]


# ------------------------------------------------------------------------------------------------
# problems in the member names: raise / skip (reported) / warn


DUP = [("k/1.jpg", b"a"), ("k/1.jpg", b"b"), ("k/2.jpg", b"c")]
CASE_DUP = [("k/1.jpg", b"a"), ("k/1.JPG", b"b"), ("k/2.jpg", b"c")]
REAPPEAR = [("k/1.cls", b"1"), ("k/2.cls", b"2"), ("k/1.jpg", b"late"), ("k/3.cls", b"3")]
NO_EXT = [("k/1.cls", b"1"), ("k/README", b"r"), ("k/2.cls", b"2")]
HIDDEN = [("k/1.cls", b"1"), ("k/.DS_Store", b"r"), ("._2.cls", b"2"), ("k/2.cls", b"2")]


@pytest.mark.parametrize(
    "members,words,key",
    [
        (DUP, "duplicate extension 'jpg'", "k/1"),
        (CASE_DUP, "duplicate extension 'jpg'", "k/1"),
        (REAPPEAR, "key reappears later", "k/1"),
    ],
    ids=["dup", "case-dup", "reappear"],
)
def test_name_problems_raise_by_default(members, words, key):
    with pytest.raises(SampleError) as info:
        read(tar_of(members))
    err = info.value
    assert words in str(err) and URL in str(err) and f"key {key!r}" in str(err)
    assert err.key == key and err.url == URL and err.offset is not None


def test_duplicate_extension_skip_keeps_first_and_reports():
    errors: list[ShardflowError] = []
    out = read(tar_of(DUP), on_error="skip", report=errors.append)
    assert out[0]["jpg"] == b"a" and keys(out) == ["k/1", "k/2"]
    assert len(errors) == 1 and "duplicate extension" in str(errors[0])


def test_reappearing_key_is_reported_and_not_merged():
    errors: list[ShardflowError] = []
    out = read(tar_of(REAPPEAR), on_error="skip", report=errors.append)
    assert keys(out) == ["k/1", "k/2", "k/3"]
    assert "jpg" not in out[0], "a later member must not be merged into an earlier sample"
    assert len(errors) == 1 and errors[0].key == "k/1"


def test_member_without_extension_is_reported():
    errors: list[ShardflowError] = []
    out = read(tar_of(NO_EXT), on_error="skip", report=errors.append)
    assert keys(out) == ["k/1", "k/2"] and len(errors) == 1 and "k/README" in str(errors[0])


def test_hidden_files_are_reported_not_made_into_samples():
    with pytest.warns(ShardflowWarning, match="hidden file"):  # a member of no sample: left out, never raised
        assert keys(read(tar_of(HIDDEN))) == ["k/1", "k/2"]
    errors: list[ShardflowError] = []
    out = read(tar_of(HIDDEN), on_error="skip", report=errors.append)
    assert keys(out) == ["k/1", "k/2"]
    assert len(errors) == 2 and all("hidden file" in str(e) for e in errors)


def test_warn_policy_issues_warnings():
    errors: list[ShardflowError] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = read(tar_of(DUP + [("k/2.jpg", b"d")]), on_error="warn", report=errors.append)
    assert keys(out) == ["k/1", "k/2"]
    assert len(errors) == 2
    assert [w.category for w in caught] == [ShardflowWarning, ShardflowWarning]
    assert "duplicate extension" in str(caught[0].message)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="on_error"):
        read(tar_of(DUP), on_error="ignore")


# ------------------------------------------------------------------------------------------------
# writing samples: names that cannot round-trip are refused


@pytest.mark.parametrize(
    "key,why",
    [
        ("", "non-empty"),
        (None, "non-empty"),
        (7, "non-empty"),
        ("a/b.c", "'.'"),
        ("dir/", "ends with '/'"),
        ("/abs/1", "absolute"),
        ("a/../1", "'..'"),
        ("a\0b", "NUL"),
    ],
)
def test_bad_keys(key, why):
    assert why in check_key(key)
    with pytest.raises(SampleError, match="key"):
        sample_members({"__key__": key, "txt": b"x"})


@pytest.mark.parametrize("key", ["000001", "a.b/c/000001", "ü/ñ", "x" * 300, "a b/c-d_e"])
def test_good_keys_round_trip(key):
    assert check_key(key) is None
    out = read(shard([{"__key__": key, "txt": b"x", "seg.png": b"p"}]))
    assert keys(out) == [key] and out[0]["seg.png"] == b"p"


@pytest.mark.parametrize(
    "sample,why",
    [
        ({"__key__": "k", "JPG": b"x"}, "not lower-case"),
        ({"__key__": "k", "j\0pg": b"x"}, "bad extension"),  # '.jpg' is written (k..jpg reads back): keys.check_ext
        ({"__key__": "k", "a/b": b"x"}, "bad extension"),
        ({"__key__": "k", "": b"x"}, "bad extension"),
        ({"__key__": "k", "json": {"a": 1}}, "not bytes"),
        ({"__key__": "k", "__url__": "x"}, "no data"),
    ],
)
def test_bad_samples_are_refused(sample, why):
    with pytest.raises(SampleError, match=why) as info:
        sample_members(sample)
    assert info.value.key == "k"


def test_sample_members_sorted_and_metadata_left_out():
    members = sample_members({"__key__": "k", "__url__": "u", "txt": b"t", "cls": b"1", "b.png": memoryview(b"m")})
    assert members == [("k.b.png", b"m"), ("k.cls", b"1"), ("k.txt", b"t")]


# ------------------------------------------------------------------------------------------------
# damaged archives: skip delivers every good sample, never a partial one


def two_member_shard(n=10):
    return shard([{"__key__": f"s/{i:04d}", "cls": b"%d" % i, "jpg": bytes([i]) * 900} for i in range(n)])


def header_offsets(data: bytes) -> list[int]:
    return [m.offset for m in iter_members(io.BytesIO(data))]


def damage(data: bytes, at: int, length: int = 1, fill: int | None = None) -> bytes:
    out = bytearray(data)
    for i in range(at, at + length):
        out[i] = fill if fill is not None else out[i] ^ 0x21
    return bytes(out)


@pytest.mark.parametrize("member", [6, 7], ids=["first-member", "second-member"])
@pytest.mark.parametrize(
    "where,length,fill",
    [(140, 1, None), (3, 1, None), (0, BLOCK, 0xFF), (124, 12, 0x37)],
    ids=["mtime-byte", "name-byte", "wiped", "size-field"],
)
def test_bad_header_checksum_skip_leaves_out_the_samples_next_to_the_damage(member, where, length, fill):
    # nothing of a damaged header is trusted, so the sample in progress and the first one after the
    # damage cannot be known whole: both are left out and reported by key, every other is delivered;
    # damage right after the first member of a sample leaves out the sample before it too (that
    # member's header may be a displaced one standing where a member of the sample before was)
    data = two_member_shard()
    at = header_offsets(data)[member]  # members 6, 7 are s/0003.cls, s/0003.jpg
    bad = damage(data, at + where, length, fill)
    with pytest.raises(FormatError) as info:
        read(bad)
    assert "bad tar header checksum" in str(info.value) and info.value.offset == at and URL in str(info.value)

    errors: list[ShardflowError] = []
    out = read(bad, on_error="skip", report=errors.append)
    lost = {"s/0002", "s/0003"} if member == 6 else {"s/0002", "s/0003", "s/0004"}
    assert keys(out) == [f"s/{i:04d}" for i in range(10) if f"s/{i:04d}" not in lost]
    assert all(s["jpg"] == bytes([int(s["cls"])]) * 900 for s in out)
    assert isinstance(errors[0], FormatError) and errors[0].offset == at
    assert {e.key for e in errors if isinstance(e, SampleError)} == lost
    assert len(errors) == 1 + len(lost)


def test_damage_in_a_shard_of_one_member_samples():
    data = shard([{"__key__": f"s/{i:04d}", "txt": b"t" * (100 + i)} for i in range(10)])
    offsets = header_offsets(data)
    errors: list[ShardflowError] = []
    out = read(damage(data, offsets[4] + 140), on_error="skip", report=errors.append)
    # s/0002 too: damage right after a sample's first member (here its only one) may mean that member's
    # header was displaced onto the place of one of s/0002's
    assert keys(out) == [f"s/{i:04d}" for i in range(10) if i not in (2, 3, 4, 5)]
    assert errors[0].offset == offsets[4] and f"offset {offsets[5]}" in errors[0].reason  # the region s/0004 was in
    assert [e.key for e in errors[1:]] == ["s/0003", "s/0002", "s/0005"]


@pytest.mark.parametrize("wipe", [True, False], ids=["wiped", "readable-name"])
def test_damage_in_a_mixed_shard_drops_the_neighbours(wipe):
    # extension sets differ from sample to sample; a damaged header's name is never used as a hint
    samples = [{"__key__": f"s/{i:04d}", "cls": b"1", **({"jpg": b"j" * 600} if i % 2 else {"png": b"p"})}
               for i in range(8)]
    data = shard(samples)
    at = header_offsets(data)[7]  # s/0003.jpg
    errors: list[ShardflowError] = []
    bad = damage(data, at, BLOCK, 0xFF) if wipe else damage(data, at + 140)
    out = read(bad, on_error="skip", report=errors.append)
    # s/0002 too: the damage follows the first member of s/0003 (see the test above)
    assert keys(out) == ["s/0000", "s/0001", "s/0005", "s/0006", "s/0007"]
    left_out = sorted(e.key for e in errors if isinstance(e, SampleError))
    assert left_out == ["s/0002", "s/0003", "s/0004"]


def test_truncated_shard_with_skip_delivers_complete_samples_then_raises():
    data = two_member_shard()
    at = header_offsets(data)[9]  # s/0004.jpg
    got = []
    with pytest.raises(FormatError) as info:
        for s in read_samples(io.BytesIO(data[: at + 200]), URL, on_error="skip", report=lambda e: None):
            got.append(s["__key__"])
    assert got == ["s/0000", "s/0001", "s/0002", "s/0003"]  # s/0004 is in progress: not delivered
    assert info.value.key == "s/0004" and "truncated" in str(info.value)


def test_truncated_header_error_names_the_sample_in_progress():
    data = two_member_shard()
    at = header_offsets(data)[9]
    with pytest.raises(FormatError) as info:
        read(data[: at + 100])
    err = info.value
    assert (err.url, err.key, err.offset) == (URL, "s/0004", at)
    assert str(err) == f"shard {URL}, key 's/0004', offset {at}: truncated tar: header needs 512 bytes, got 100"


def test_read_samples_opens_and_closes_a_url(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(two_member_shard(3))
    it = read_samples(str(path))
    assert next(it)["__url__"] == str(path)
    it.close()
    assert keys(read_samples(str(path))) == ["s/0000", "s/0001", "s/0002"]


# ------------------------------------------------------------------------------------------------
# decode errors end to end (codecs.py)


def test_undecodable_image_and_bad_json_name_url_and_key():
    codecs = pytest.importorskip("shardflow.codecs")
    import numpy as np
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(png, format="PNG")
    data = shard([
        {"__key__": "ok", "png": png.getvalue(), "json": b'{"a": 1}'},
        {"__key__": "badimg", "png": b"\x89PNG\r\n\x1a\n not really", "json": b"{}"},
        {"__key__": "badjson", "png": png.getvalue(), "json": b'{"a": '},
    ])
    decoder = codecs.Decoder("rgb8")
    decoded = []
    errors = []
    for sample in read(data):
        try:
            decoded.append(decoder(sample))
        except DecodeError as exc:
            errors.append(exc)
    assert [d["__key__"] for d in decoded] == ["ok"]
    assert decoded[0]["png"].shape == (4, 4, 3) and decoded[0]["json"] == json.loads('{"a": 1}')
    assert [e.key for e in errors] == ["badimg", "badjson"]
    for e in errors:
        assert URL in str(e) and f"key {e.key!r}" in str(e)
    assert "png" in str(errors[0]) and "json" in str(errors[1])
