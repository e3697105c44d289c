"""Streaming tar read (ustar, GNU, pax, gzip) and deterministic tar write, against Python's tarfile."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest

from shardflow.errors import FormatError, ShardflowWarning
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_read import Member, NotRegular, iter_members
from shardflow.shards.tar_recover import Corruption
from shardflow.shards.tar_write import TarStreamWriter


def write_tar(members, **kw) -> bytes:
    buf = io.BytesIO()
    w = TarStreamWriter(buf, **kw)
    for name, data in members:
        w.add(name, data)
    w.finish()
    assert w.bytes_written == len(buf.getvalue())
    return buf.getvalue()


def stdlib_tar(entries, fmt=tarfile.PAX_FORMAT, compress: str = "") -> bytes:
    """A tar made by Python's tarfile. entries: (name, bytes) files or (name, "dir"/"symlink"/"hardlink")."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:" + compress, format=fmt) as tf:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if isinstance(what, bytes):
                info.size = len(what)
                tf.addfile(info, io.BytesIO(what))
            elif what == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif what == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = "target.txt"
                tf.addfile(info)
            elif what == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = "a/000.txt"
                tf.addfile(info)
            else:
                raise ValueError(what)
    return buf.getvalue()


def members_of(data: bytes, **kw) -> list[tuple[str, bytes]]:
    return [(m.name, m.data) for m in iter_members(io.BytesIO(data), "mem://x.tar", **kw)]


def payload(i: int, n: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (n // 32) + b"x" * (n % 32)


class ShortReads(io.RawIOBase):
    """A stream that returns at most `step` bytes per read, like a socket or a slow pipe."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self._data = data
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._step if n < 0 else min(n, self._step)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


# ------------------------------------------------------------------------------------------------
# reading the formats


LONG = "d" * 60 + "/" + "e" * 70 + "/sample-0001.seg.png"  # 152 chars


@pytest.mark.parametrize(
    "fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"]
)
def test_reads_every_stdlib_format(fmt):
    files = [
        ("a/000.txt", b"hello"),
        ("a/000.json", b'{"x": 1}'),
        (LONG, payload(1, 1000)),
        ("b.c/d.e/001.cls", b"7"),
        ("empty/002.bin", b""),
        ("big/003.bin", payload(3, 3 * BLOCK + 1)),
    ]
    assert members_of(stdlib_tar(files, fmt)) == files


def test_ustar_prefix_field_is_joined():
    data = stdlib_tar([(LONG, b"x")], tarfile.USTAR_FORMAT)
    header = data[:BLOCK]
    assert header[345:500].rstrip(b"\0"), "tarfile should have used the ustar prefix field"
    assert members_of(data) == [(LONG, b"x")]


def test_gnu_long_name_entry_is_used():
    name = "g" * 300 + "/x.txt"
    data = stdlib_tar([(name, b"long")], tarfile.GNU_FORMAT)
    assert data[156:157] == b"L"
    assert members_of(data) == [(name, b"long")]


def test_pax_path_and_unicode_name():
    name = "données/échantillon-ü.jpg"
    data = stdlib_tar([(name, b"u"), ("plain.txt", b"p")], tarfile.PAX_FORMAT)
    assert members_of(data) == [(name, b"u"), ("plain.txt", b"p")]


def test_pax_global_header_is_ignored():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "hi"}) as tf:
        info = tarfile.TarInfo("k.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"1"))
    assert buf.getvalue()[156:157] == b"g"
    assert members_of(buf.getvalue()) == [("k.txt", b"1")]


def test_directories_are_skipped_and_links_reported():
    files = [("a", "dir"), ("a/000.txt", b"zero"), ("a/link.txt", "symlink"), ("a/hard.txt", "hardlink"),
             ("a/001.txt", b"one")]
    got = list(iter_members(io.BytesIO(stdlib_tar(files)), "mem://x.tar"))
    assert [(m.name, m.data) for m in got if isinstance(m, Member)] == [("a/000.txt", b"zero"), ("a/001.txt", b"one")]
    assert [m.error.key for m in got if isinstance(m, NotRegular)] == ["a/link", "a/hard"]  # never silently


def test_base256_size_field():
    body = b"z" * 700
    header = bytearray(tarfile.TarInfo("n.bin").tobuf(tarfile.USTAR_FORMAT))
    header[124:136] = b"\x80" + (700).to_bytes(11, "big")  # GNU base-256 encoding
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data = bytes(header) + body + bytes(-700 % BLOCK) + bytes(2 * BLOCK)
    assert members_of(data) == [("n.bin", body)]


def test_offsets_point_at_headers():
    files = [(f"k/{i:03d}.bin", payload(i, 100 * i)) for i in range(8)]
    data = stdlib_tar(files, tarfile.GNU_FORMAT)
    for m in iter_members(io.BytesIO(data)):
        info = tarfile.TarInfo.frombuf(data[m.offset : m.offset + BLOCK], "utf-8", "surrogateescape")
        assert info.name == m.name and info.size == len(m.data)


@pytest.mark.parametrize("step", [1, 7, 513, 4096])
def test_short_reads(step):
    files = [(f"k/{i:03d}.bin", payload(i, 37 * i)) for i in range(12)]
    data = write_tar(files)
    assert [(m.name, m.data) for m in iter_members(ShortReads(data, step))] == files
    gz = gzip.compress(data)
    assert [(m.name, m.data) for m in iter_members(ShortReads(gz, step))] == files


def test_gzip_is_detected_and_multi_member_gzip_is_read():
    files = [(f"s/{i:04d}.txt", payload(i, 50)) for i in range(30)]
    data = write_tar(files)
    assert members_of(gzip.compress(data)) == files
    cut = 7 * BLOCK
    two_members = gzip.compress(data[:cut]) + gzip.compress(data[cut:])
    assert members_of(two_members) == files


def test_members_cross_buffer_boundaries():
    # members around the 1 MiB read size, so headers and data straddle buffer refills
    sizes = [(1 << 20) - 700, 300, (1 << 20) + 5, 1, 2 << 20, 511, 512, 513]
    files = [(f"x/{i:02d}.bin", payload(i, n)) for i, n in enumerate(sizes)]
    assert members_of(write_tar(files)) == files


def test_large_members_from_a_local_file(tmp_path):
    # members over 4 MiB are read from a local file in one piece (after stepping back over the
    # read-ahead); the result must be the same as from a non-seekable stream and from gzip
    sizes = [100, (4 << 20) + 3, 700, 9_000_001, 1, (4 << 20) - 1, 5_000_000]
    files = [(f"x/{i:02d}.bin", payload(i, n)) for i, n in enumerate(sizes)]
    data = write_tar(files)
    path = tmp_path / "big.tar"
    path.write_bytes(data)
    with open(path, "rb", buffering=1 << 20) as f:
        got = [(m.name, m.data, m.offset) for m in iter_members(f)]
    assert [(n, d) for n, d, _ in got] == files
    assert [o for *_, o in got] == [m.offset for m in iter_members(io.BytesIO(data))]
    assert members_of(gzip.compress(data, compresslevel=1)) == files
    with open(path, "rb") as f:  # truncated inside a large member: still an error
        cut = io.BytesIO(f.read(got[3][2] + 6_000_000))
    with pytest.raises(FormatError, match="needs 9000001 bytes"):
        list(iter_members(cut))
    path.write_bytes(data[: got[3][2] + 6_000_000])
    with open(path, "rb") as f, pytest.raises(FormatError, match="needs 9000001 bytes"):
        list(iter_members(f))


def test_stream_stops_at_the_end_marker_and_warns_about_trailing_bytes():
    data = write_tar([("a.txt", b"a")]) + b"garbage after the end"
    with pytest.warns(ShardflowWarning, match="21 bytes of data after the end-of-archive marker"):
        assert members_of(data) == [("a.txt", b"a")]


def test_reading_is_lazy():
    """The first members arrive before the rest of the stream is read."""
    files = [(f"s/{i:04d}.bin", payload(i, 20_000)) for i in range(200)]  # ~4 MB
    data = write_tar(files)

    class Tracking(io.BytesIO):
        high = 0

        def read(self, n=-1):
            out = super().read(n)
            Tracking.high = max(Tracking.high, self.tell())
            return out

    it = iter_members(Tracking(data))
    first = next(it)
    assert first.name == "s/0000.bin"
    assert Tracking.high <= 2 << 20  # at most a couple of read-ahead chunks, not the 4 MB file


# ------------------------------------------------------------------------------------------------
# writing


def test_roundtrip_and_stdlib_reads_what_we_write():
    files = [("a/000.txt", b"t"), (LONG, payload(0, 1234)), ("ü/ñ.json", b"{}"), ("e/1.bin", b""),
             ("x" * 99 + ".z", b"99"), ("y" * 96 + ".abc", b"100")]
    data = write_tar(files, mtime=1234)
    assert members_of(data) == files
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        infos = tf.getmembers()
        assert [i.name for i in infos] == [n for n, _ in files]
        for info, (_, body) in zip(infos, files):
            assert tf.extractfile(info).read() == body
            assert (info.mtime, info.uid, info.gid, info.mode) == (1234, 0, 0, 0o444)
            assert (info.uname, info.gname) == ("", "")
            assert info.isreg()


def test_write_is_deterministic():
    files = [(f"k/{i:05d}.{ext}", payload(i, 10 * i)) for i in range(50) for ext in ("cls", "jpg")]
    a, b = write_tar(files), write_tar(list(files))
    assert a == b
    assert write_tar(files, mtime=1) != a  # the mtime really is in the bytes
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()
    assert len(a) % BLOCK == 0


@pytest.mark.parametrize(
    "name,size",
    [("a.b", 0), ("a.b", 1), ("a.b", 511), ("a.b", 512), ("a.b", 513), (LONG, 10), ("é.x", 3), ("n" * 100, 5),
     ("n" * 101, 5), ("p" * 600 + ".bin", 1000)],
)
def test_member_size_is_exact(name, size):
    buf = io.BytesIO()
    w = TarStreamWriter(buf)
    w.add(name, b"q" * size)
    assert w.bytes_written == TarStreamWriter.member_size(name, size)
    w.flush()
    assert len(buf.getvalue()) == w.bytes_written


def test_small_members_are_gathered_into_few_writes():
    class Counting(io.BytesIO):
        calls = 0

        def write(self, b):
            Counting.calls += 1
            return super().write(b)

    out = Counting()
    w = TarStreamWriter(out)
    for i in range(2000):
        w.add(f"k/{i:05d}.txt", b"x" * 100)
    w.add("big.bin", b"b" * 200_000)  # written straight through
    w.finish()
    assert Counting.calls < 30
    assert [(m.name, len(m.data)) for m in iter_members(io.BytesIO(out.getvalue()))][-1] == ("big.bin", 200_000)


def test_byte_sum_is_exact():
    import random

    from shardflow.shards.tar_headers import byte_sum as _byte_sum

    rng = random.Random(0)
    blocks = [bytes(512), b"\xff" * 512, b"\xff" * 100, b""] + [rng.randbytes(rng.randint(0, 512)) for _ in range(500)]
    for block in blocks:
        assert _byte_sum(block) == sum(block)


def test_pax_is_written_only_when_needed():
    assert write_tar([("n" * 100, b"")])[156:157] == b"0"
    assert write_tar([("n" * 101, b"")])[156:157] == b"x"
    assert write_tar([("ñ", b"")])[156:157] == b"x"


# ------------------------------------------------------------------------------------------------
# bad input


def good_tar() -> bytes:
    return write_tar([(f"s/{i:04d}.{ext}", payload(i, 700)) for i in range(10) for ext in ("cls", "jpg")])


def expect_format_error(data: bytes, *words: str, offset: int | None = None, **kw) -> FormatError:
    with pytest.raises(FormatError) as info:
        list(iter_members(io.BytesIO(data), "file:///d/bad.tar", **kw))
    err = info.value
    message = str(err)
    assert "file:///d/bad.tar" in message
    for word in words:
        assert word in message
    if offset is not None:
        assert err.offset == offset and f"offset {offset}" in message
    return err


def test_empty_and_tiny_files_are_not_tars():
    expect_format_error(b"", "empty file, not a tar archive", offset=0)
    expect_format_error(b"hello world\n", "not a tar archive", offset=0)


def test_non_tar_file():
    text = b"this is a README, not a tar\n" * 100
    expect_format_error(text, "not a tar archive", offset=0)
    expect_format_error(text, "not a tar archive", offset=0, resync=True)  # no resync through a non-tar
    png_like = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
    expect_format_error(png_like, "not a tar archive", offset=0)
    expect_format_error(gzip.compress(text), "not a tar archive", offset=0)


def test_truncated_inside_a_header():
    data = good_tar()
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    cut = offsets[5] + 100
    expect_format_error(data[:cut], "truncated tar", "header needs 512 bytes, got 100", offset=offsets[5])


def test_truncated_inside_member_data_names_member_and_key():
    data = good_tar()
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    err = expect_format_error(data[: offsets[7] + BLOCK + 300], "truncated tar", "s/0003.jpg", offset=offsets[7])
    assert err.key == "s/0003" and "key 's/0003'" in str(err)
    assert "needs 700 bytes, got 300" in str(err)


def test_truncated_padding_and_missing_end_marker():
    data = good_tar()
    end = len(data) - 2 * BLOCK  # where the end-of-archive marker starts
    expect_format_error(data[: end - 100], "truncated tar", "padding")
    expect_format_error(data[:end], "truncated tar", "end-of-archive marker", offset=end)
    # one zero block, then the end: the marker is cut short (a lost block of the last member's data
    # looks the same), an error; with resync every member is read, then it is reported
    expect_format_error(data[: end + BLOCK], "end-of-archive marker is cut short", offset=end)
    items = list(iter_members(io.BytesIO(data[: end + BLOCK]), resync=True))
    assert len(items) == 21 and isinstance(items[-1], Corruption)


@pytest.mark.parametrize("resync", [False, True])
def test_truncation_is_an_error_even_with_resync(resync):
    data = good_tar()
    with pytest.raises(FormatError, match="truncated"):
        list(iter_members(io.BytesIO(data[:5000]), resync=resync))


def test_members_before_a_truncation_are_delivered_first():
    data = good_tar()
    got = []
    with pytest.raises(FormatError):
        for m in iter_members(io.BytesIO(data[:6000])):
            got.append(m.name)
    assert got[:3] == ["s/0000.cls", "s/0000.jpg", "s/0001.cls"]


def test_corrupt_gzip():
    gz = bytearray(gzip.compress(good_tar()))
    gz[len(gz) // 2] ^= 0xFF
    gz[len(gz) // 2 + 1] ^= 0x55
    expect_format_error(bytes(gz), "corrupt gzip")


def test_truncated_gzip():
    gz = gzip.compress(good_tar())
    expect_format_error(gz[: len(gz) // 2], "corrupt gzip")


@pytest.mark.parametrize("size", [20 * 1024, 2 << 20], ids=["small", "exactly-2MiB"])
def test_gzip_with_bad_crc(size):
    # the tar ends before the gzip trailer: the reader must still read on to check the CRC, also
    # when the end-of-archive marker ends exactly at a read boundary
    data = write_tar([("a.bin", payload(1, size - 3 * BLOCK))])
    assert len(data) == size
    gz = bytearray(gzip.compress(data))
    gz[-8] ^= 0x01
    expect_format_error(bytes(gz), "corrupt gzip")


def test_bad_checksum_raises_with_offset():
    data = bytearray(good_tar())
    offsets = [m.offset for m in iter_members(io.BytesIO(bytes(data)))]
    data[offsets[6] + 130] ^= 0x01  # a bit of the size field
    expect_format_error(bytes(data), "bad tar header checksum", offset=offsets[6])


def corrupt(data: bytes, at: int, length: int = 1, value: int | None = None) -> bytes:
    out = bytearray(data)
    for i in range(at, at + length):
        out[i] = value if value is not None else out[i] ^ 0x5A
    return bytes(out)


def test_resync_one_corruption_names_its_region_and_the_rest_is_delivered():
    data = good_tar()
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    damaged = corrupt(data, offsets[6] + 140)  # mtime field of s/0003.cls: nothing of it is trusted
    items = list(iter_members(io.BytesIO(damaged), "mem://x", resync=True))
    corruptions = [x for x in items if isinstance(x, Corruption)]
    assert len(corruptions) == 1
    c = corruptions[0]
    assert c.error.offset == offsets[6] and c.end == offsets[7] and c.error.key is None and c.key is None
    assert f"damaged up to offset {offsets[7]} (reading resumed there): bad tar header checksum" in str(c.error)
    names = [x.name for x in items if isinstance(x, Member)]
    assert names == [n for n, _ in members_of(data) if n != "s/0003.cls"]


def test_resync_after_a_wiped_header_scans_to_the_next_header():
    data = good_tar()
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    damaged = corrupt(data, offsets[6], BLOCK, 0xFF)  # the whole header is garbage
    items = list(iter_members(io.BytesIO(damaged), resync=True))
    corruptions = [x for x in items if isinstance(x, Corruption)]
    assert len(corruptions) == 1, "one damaged region must give one Corruption, not one per data block"
    assert corruptions[0].error.offset == offsets[6] and corruptions[0].end == offsets[7]
    names = [x.name for x in items if isinstance(x, Member)]
    assert names == [n for n, _ in members_of(data) if n != "s/0003.cls"]


def test_resync_through_zero_filled_data():
    # a member full of zero blocks after the damage must not be mistaken for the end of the archive
    files = [("a/0.bin", b"a" * 600), ("b/0.bin", bytes(5000)), ("c/0.bin", b"c" * 10)]
    data = write_tar(files)
    damaged = corrupt(data, 1536, BLOCK, 0xFF)  # header of b/0.bin
    items = list(iter_members(io.BytesIO(damaged), resync=True))
    assert [x.name for x in items if isinstance(x, Member)] == ["a/0.bin", "c/0.bin"]
    assert sum(isinstance(x, Corruption) for x in items) == 1


def test_resync_damaged_pax_header_is_not_trusted():
    # the records of a damaged pax header are not read: the member it described, under the stand-in
    # name of its own header after damage, is reported as damage too (its sample is unknown)
    files = [("s/0000.cls", b"0"), (LONG, b"long"), ("s/0002.cls", b"2")]
    data = write_tar(files)
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    pax_header = offsets[1] - 2 * BLOCK  # pax header + its one block of records
    assert data[pax_header + 156 : pax_header + 157] == b"x"
    damaged = corrupt(data, pax_header + 140)
    items = list(iter_members(io.BytesIO(damaged), resync=True))
    assert isinstance(items[1], Corruption) and items[1].error.offset == pax_header
    assert isinstance(items[2], Corruption) and items[2].error.offset == offsets[1]
    assert "stand in" in items[2].error.reason and LONG[:100] in items[2].error.reason
    assert [(x.name, x.data) for x in items if isinstance(x, Member)] == [files[0], files[2]]


def test_resync_damage_at_the_end_of_the_stream():
    data = good_tar()
    last_header = [m.offset for m in iter_members(io.BytesIO(data))][-1]
    items = list(iter_members(io.BytesIO(corrupt(data, last_header, BLOCK, 0xFF)), resync=True))
    assert isinstance(items[-1], Corruption)
    assert sum(isinstance(x, Member) for x in items) == 19


def test_resync_then_truncation_still_raises():
    data = good_tar()
    offsets = [m.offset for m in iter_members(io.BytesIO(data))]
    damaged = corrupt(data, offsets[3], BLOCK, 0xFF)[: offsets[9] + 10]
    seen = []
    with pytest.raises(FormatError, match="truncated"):
        for x in iter_members(io.BytesIO(damaged), resync=True):
            seen.append(x)
    assert sum(isinstance(x, Corruption) for x in seen) == 1


def test_format_error_pickles_with_its_fields():
    import pickle

    err = expect_format_error(good_tar()[:3000], "truncated")
    back = pickle.loads(pickle.dumps(err))
    fields = (type(back), back.url, back.key, back.offset, str(back))
    assert fields == (type(err), err.url, err.key, err.offset, str(err))
