"""Displaced headers and cut pax headers (issue 26, items 3 and 17): two blocks that trade places,
a header that moves into another member's data, a pax record that loses its header. Never a
partial sample in raise mode, every sample left out reported by key. Shards are generated here."""

from __future__ import annotations

import io
import tarfile
import warnings

import pytest

from shardflow.errors import FormatError, SampleError, ShardflowError, ShardflowWarning
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_read import iter_members
from tests.support.tar_corruption import tar_of

URL = "mem://displaced.tar"


def stdlib_tar(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> tuple[bytes, list[tarfile.TarInfo]]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return data, tf.getmembers()


def read(data: bytes, on_error: str = "skip") -> tuple[list[dict], list[ShardflowError], ShardflowError | None]:
    out: list[dict] = []
    errors: list[ShardflowError] = []
    end = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardflowWarning)
        try:
            for sample in read_samples(io.BytesIO(data), URL, on_error=on_error, report=errors.append):
                out.append({k: v for k, v in sample.items() if k != "__url__"})
        except ShardflowError as exc:
            end = exc
    return out, errors, end


def swap(data: bytes, a: int, b: int) -> bytes:
    """The blocks at offsets a < b trade places."""
    return data[:a] + data[b : b + BLOCK] + data[a + BLOCK : b] + data[a : a + BLOCK] + data[b + BLOCK :]


def header_offsets(data: bytes) -> list[int]:
    return [m.offset for m in iter_members(io.BytesIO(data))]


# item 3: a PAX tar (tarfile's default format) cut inside the ustar header that follows a pax header


@pytest.mark.parametrize("fmt, key", [(tarfile.PAX_FORMAT, "kéy1"), (tarfile.PAX_FORMAT, "d" * 120 + "/1"),
                                      (tarfile.GNU_FORMAT, "d" * 120 + "/1")],
                         ids=["pax-non-ascii", "pax-long", "gnu-long"])
def test_cut_inside_the_header_after_a_pax_record_delivers_no_partial_sample(fmt, key):
    data, infos = stdlib_tar([("kéy0.cls", b"0"), (f"{key}.cls", b"1"), (f"{key}.json", b"{}")], fmt)
    header = infos[2].offset_data - BLOCK  # the ustar header of the json, after its pax/long-name record
    for cut in (header + 200, header + 300, header + 511):
        out, _, end = read(data[:cut], "raise")
        assert [s["__key__"] for s in out] == ["kéy0"], cut  # not key 1 without its json
        assert isinstance(end, FormatError) and end.key == key and "truncated" in end.reason


def test_cut_inside_a_bare_header_still_delivers_the_sample_before_it():
    data = tar_of([("a.cls", b"0"), ("b.cls", b"1")])
    out, _, end = read(data[: header_offsets(data)[1] + 300], "raise")
    assert [s["__key__"] for s in out] == ["a"] and end is not None and end.key == "b"


# item 17: displaced headers


def test_a_header_moved_into_a_later_members_data_is_found_there():
    # s1.txt's header trades places with a block in the middle of s3.bin's data: the hole gives
    # damage at once, and the header inside s3.bin's data is damage too (a size that holds a header)
    members = [("s0.cls", b"0"), ("s1.cls", b"1"), ("s1.txt", b"t" * 100), ("s2.cls", b"2"),
               ("s3.bin", bytes(range(256)) * 8)]
    data = tar_of(members)
    at = header_offsets(data)
    bad = swap(data, at[2], at[4] + 2 * BLOCK)
    out, errors, end = read(bad, "raise")
    assert out == [] and isinstance(end, FormatError)  # s0 too: the damage follows s1's first member
    out, errors, _ = read(bad)
    assert "s1" not in [s["__key__"] for s in out] and "s3" not in [s["__key__"] for s in out]
    assert {"s1", "s3"} <= {e.key for e in errors if isinstance(e, SampleError)}


def test_a_header_swapped_onto_an_earlier_members_place_leaves_that_sample_out():
    # the header of the empty s2.cls takes the place of s0.json's: s0 looks whole (s0.cls, then a new
    # key) until the block after it, s0.json's data, is no header. s0 is held back until then.
    members = [("s0.cls", b"0"), ("s0.json", b"j" * 100), ("s1.cls", b"1"), ("s2.cls", b"")]
    data = tar_of(members)
    at = header_offsets(data)
    bad = swap(data, at[1], at[3])
    out, _, end = read(bad, "raise")
    assert out == [] and isinstance(end, FormatError)
    out, errors, _ = read(bad)
    assert "s0" not in [s["__key__"] for s in out]
    assert "s0" in {e.key for e in errors if isinstance(e, SampleError)}


def test_a_member_whose_data_holds_a_header_is_damage_but_a_tar_member_is_not():
    inner = tar_of([("x.txt", b"inner")])
    data = tar_of([("a.cls", b"0"), ("a.tar", inner), ("b.cls", b"1")])
    out, errors, end = read(data, "raise")  # a member that is itself a tar: read as data
    assert end is None and [s["__key__"] for s in out] == ["a", "b"] and out[0]["tar"] == inner
    # a size that lies and swallows the next member: its header lies at a block boundary of the data
    members = [("a.cls", b"0"), ("a.txt", b"t" * 600), ("b.cls", b"1" * 10), ("c.cls", b"2" * 900)]
    data = bytearray(tar_of(members))
    at = header_offsets(bytes(data))
    swallowing = tar_of([("a.txt", b"t" * (600 + BLOCK + BLOCK + 512))])[:BLOCK]  # same name, a size 3 blocks longer
    data[at[1] : at[1] + BLOCK] = swallowing
    out, errors, end = read(bytes(data), "raise")
    assert out == [] and isinstance(end, FormatError) and "does not end where its size field says" in end.reason
    out, errors, _ = read(bytes(data))
    assert {"a", "b"} <= {e.key for e in errors if isinstance(e, SampleError)}  # b: its header is in the region


def test_a_stand_in_name_after_a_lost_pax_record_leaves_out_the_samples_next_to_it():
    # the pax header of the long name trades places with the header of the next sample's first member:
    # the long member comes out under its stand-in (truncated, no extension), the next sample may own it
    long = "d" * 120 + "/1"
    data, infos = stdlib_tar([("s0.cls", b"0"), (f"{long}.cls", b"1"), ("s2.cls", b"2"), ("s2.txt", b"t")])
    bad = swap(data, infos[1].offset, infos[2].offset)
    out, errors, end = read(bad, "raise")
    assert out == [] and end is not None
    out, errors, _ = read(bad)
    assert out == []  # s0: damage follows it; s2: its header is in the damage; the long one: unknown
    reported = {e.key for e in errors}
    assert {"s0", "s2"} <= reported and any("stand in" in e.reason for e in errors)


def test_a_question_mark_stand_in_next_to_its_real_key_leaves_out_both():
    # tarfile writes 'k?y1.json' in the ustar header of 'kéy1.json'; with its pax record lost (zeroed
    # then skipped), the member reads under the stand-in: kéy1 must not come out without its json
    data, infos = stdlib_tar([("kéy0.cls", b"0"), ("kéy1.cls", b"1"), ("kéy1.json", b"{}"), ("s2.cls", b"2")])
    assert tarfile.TarInfo.frombuf(data[infos[2].offset_data - BLOCK :][:BLOCK], "ascii", "strict").name == "k?y1.json"
    bad = data[: infos[2].offset] + data[infos[2].offset_data - BLOCK :]  # the record removed
    out, errors, end = read(bad, "raise")
    assert [s["__key__"] for s in out] == ["kéy0"] and end is not None
    out, errors, _ = read(bad)
    assert [s["__key__"] for s in out] == ["kéy0", "s2"]
    assert {"kéy1", "k?y1"} <= {e.key for e in errors}


def test_a_pax_record_followed_by_another_members_header_is_damage():
    long = "d" * 120 + "/1"
    data, infos = stdlib_tar([("s0.cls", b"0"), (f"{long}.cls", b"1"), ("s2.cls", b"2"), ("s3.cls", b"3")])
    bad = swap(data, infos[1].offset_data - BLOCK, infos[3].offset)  # the long member's header <-> s3's
    out, errors, end = read(bad, "raise")
    assert out == []  # s0 is held back: the damage follows the first member after it
    assert isinstance(end, FormatError) and "has a header named 's3.cls'" in end.reason
