"""Header fields read on every member (issue 28 item 3 made them cheaper): header_name, checksum_ok and
check_key must judge every block exactly as the plain definitions do, damage included."""

from __future__ import annotations

import io
import tarfile

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.shards.keys import check_key
from shardflow.shards.tar_headers import checksum_ok, header_name


def _plain_checksum_ok(block: bytes) -> bool:
    """The tar rule written out for blocks of bytes below 128 (where old tars' signed sums are the
    unsigned ones): the sum of the block's bytes with the checksum field read as spaces equals the
    field's octal number."""
    assert max(block) < 128
    text = block[148:156].split(b"\0", 1)[0].strip(b" ")
    try:
        stored = int(text, 8) if text else 0
    except ValueError:
        return False
    return stored == sum(block[:148]) + 8 * 32 + sum(block[156:])


def _header(name: str, prefix: bytes = b"") -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 3
    block = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    block[345:345 + len(prefix)] = prefix
    return bytes(block)


def test_header_name_with_and_without_prefix():
    assert header_name(_header("a/b.txt")) == "a/b.txt"
    assert header_name(_header("b.txt", b"some/dir")) == "some/dir/b.txt"
    assert header_name(_header("x" * 100)) == "x" * 100  # a full name field has no NUL
    long = "d/" * 60 + "f.txt"  # tarfile puts the directories in the prefix field
    assert header_name(_header(long)) == long


def test_header_name_ignores_the_prefix_area_of_a_non_ustar_header():
    block = bytearray(_header("b.txt", b"junk"))
    block[257:263] = b"ustar "  # GNU magic: no prefix field
    assert header_name(bytes(block)) == "b.txt"


def test_header_name_of_a_short_block():
    block = _header("b.txt")
    assert header_name(block[:300]) == "b.txt"  # magic present, the block ends before the prefix field
    assert header_name(block[:346]) == "b.txt"


def test_checksum_of_real_headers_and_of_damaged_ones():
    good = _header("a/b.txt")
    assert checksum_ok(good)
    for at in (0, 100, 148, 150, 155, 300, 511):
        damaged = bytearray(good)
        damaged[at] ^= 0x41
        assert checksum_ok(bytes(damaged)) == _plain_checksum_ok(bytes(damaged))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=512, max_size=512), st.booleans(), st.integers(min_value=0, max_value=511))
def test_checksum_ok_is_the_plain_rule(block, stamp, flip):
    low = bytearray(b & 0x7F for b in block)
    if stamp:  # a block that claims its own sum, as writers put it; sometimes one byte damaged after
        low[148:156] = b" " * 8
        low[148:156] = b"%06o\0 " % sum(low)
        if flip % 3 == 0:
            low[flip] ^= 0x21
    assert checksum_ok(bytes(low)) == _plain_checksum_ok(bytes(low))
    high = bytearray(block)  # any bytes: a block stamped with its unsigned sum is a header
    high[148:156] = b" " * 8
    high[148:156] = b"%06o\0 " % sum(high)
    assert checksum_ok(bytes(high))


def test_check_key_dot_dot_parts():
    assert check_key("a/../b") is not None
    assert check_key("../b") is not None
    assert check_key("a..b/c") is None  # '..' inside a part is a name, not a step up
    assert check_key("a/..b/c") is None
    assert check_key("x/y") is None


def test_a_header_with_a_signed_checksum_and_high_bytes_is_a_header():
    """Old tars (and some writers still) sum the header as signed chars: each byte over 127 counts as
    b - 256. Such a header is a header, as tarfile says too; the unsigned sum differs by 256 per byte."""
    info = tarfile.TarInfo("caf\u00e9-\u00fc.jpg")  # UTF-8: four bytes over 127 in the name
    info.size = 3
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
    signed = 256 + sum(b - 256 if b > 127 else b for i, b in enumerate(block) if not 148 <= i < 156)
    block[148:156] = b"%06o\0 " % signed
    assert checksum_ok(bytes(block))
    with tarfile.open(fileobj=io.BytesIO(bytes(block) + b"abc".ljust(512, b"\0") + bytes(1024))) as tar:
        assert tar.getnames() == ["caf\u00e9-\u00fc.jpg"]  # tarfile agrees it is a header
    block[148:156] = b"%06o\0 " % (signed + 1)
    assert not checksum_ok(bytes(block))
