"""Hostile and damaged shards (issue 12, items 1-8): never a partial sample, never a traceback,
every sample not delivered reported with shard, offset and key. Shards are generated here."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import shutil
import subprocess
import tarfile
import warnings
import zlib

import pytest

from shardflow.errors import FormatError, SampleError, ShardflowError, ShardflowWarning
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_headers import BLOCK, byte_sum
from shardflow.shards.tar_read import Member, iter_members
from shardflow.shards.tar_recover import Corruption
from shardflow.task.seeds import stable_seed
from tests.support.tar_corruption import tar_of

URL = "file:///d/shard-000000.tar"


def shard(n: int = 20, exts=("cls", "txt")) -> tuple[bytes, list[dict]]:
    samples = [{"__key__": f"s{i:06d}", **{e: f"{e}-{i}-".encode() * (7 + i) for e in exts}} for i in range(n)]
    return tar_of([(f"{s['__key__']}.{e}", s[e]) for s in samples for e in exts]), samples


def offsets(data: bytes) -> list[int]:
    return [m.offset for m in iter_members(io.BytesIO(data))]


def read(data: bytes, on_error: str = "skip", url: str = URL):
    errors: list[ShardflowError] = []
    out = list(read_samples(io.BytesIO(data), url, on_error=on_error, report=errors.append))
    return out, errors


def whole(out, samples) -> None:
    """Every delivered sample is exactly an original one."""
    by_key = {s["__key__"]: s for s in samples}
    for s in out:
        assert {k: v for k, v in s.items() if k != "__url__"} == by_key[s["__key__"]]


def reheader(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % byte_sum(bytes(header))
    return bytes(header)


# ------------------------------------------------------------------------------------------------
# 1. a lone zero block is damage, not the end


def test_lone_zero_block_is_damage_not_the_end():
    data, samples = shard()
    at = offsets(data)[13]  # header of s000006.txt
    bad = data[:at] + bytes(BLOCK) + data[at + BLOCK :]
    with pytest.raises(FormatError, match="lone zero block") as info:
        read(bad, "raise")
    assert info.value.offset == at and info.value.key == "s000006"
    out, errors = read(bad)
    whole(out, samples)
    # s000005 too: the zero block follows the first member of s000006, whose header may have been
    # displaced onto the place of one of s000005's
    assert [s["__key__"] for s in out] == [f"s{i:06d}" for i in range(20) if i not in (5, 6, 7)]
    assert errors[0].offset == at and {e.key for e in errors[1:]} == {"s000005", "s000006", "s000007"}


def test_zeroed_header_of_zero_filled_member_is_found_after_the_end_marker():
    members = [("a/0.bin", b"a" * 100), ("b/0.bin", bytes(1024)), ("c/0.bin", b"c"), ("d/0.bin", b"d")]
    data = tar_of(members)
    at = offsets(data)[1]
    bad = data[:at] + bytes(BLOCK) + data[at + BLOCK :]  # reads as two zero blocks, then c/0.bin
    with pytest.raises(FormatError, match="end-of-archive marker followed by more tar members"):
        read(bad, "raise")
    out, errors = read(bad)
    assert [s["__key__"] for s in out] == ["d/0"]  # a/0 and c/0 are next to the damage
    assert {e.key for e in errors if isinstance(e, SampleError)} == {"a/0", "c/0"}


def test_concatenated_archives_are_read_one_by_one_or_reported():
    # after an end marker a valid header may be a zeroed header of a zero-filled member: damage
    a, _ = shard(3)
    b = tar_of([("t0.jpg", b"0"), ("t1.jpg", b"1")])
    with pytest.raises(FormatError, match="end-of-archive marker followed by more tar members") as info:
        read(a + b, "raise")
    assert info.value.offset == len(a) - 2 * BLOCK
    out, errors = read(a + b)
    assert [s["__key__"] for s in out] == ["s000000", "s000001", "t1"]  # the two next to the boundary:
    assert [e.key for e in errors[1:]] == ["s000002", "t0"]  # reported


def test_end_marker_cut_short_is_reported_and_trailing_junk_warns():
    # one zero block, then the end: the last member may have lost a block (and so have been read
    # with the marker's zeros as its data), so the last sample is not known whole
    data, samples = shard(3)
    out, errors = read(data[: len(data) - BLOCK])
    assert len(out) == 2 and errors[0].offset == len(data) - 2 * BLOCK and errors[1].key == "s000002"
    with pytest.warns(ShardflowWarning, match="5 bytes of data after the end-of-archive marker"):
        out, errors = read(data + b"junk\n")
    assert len(out) == 3 and not errors
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read(data + bytes(9 * BLOCK))[0]) == 3  # zero padding (tar records) is silent


def test_lone_zero_block_is_counted_by_a_job(tmp_path):
    import shardflow as sf

    data, _ = shard()
    at = offsets(data)[13]
    (tmp_path / "in-000.tar").write_bytes(data[:at] + bytes(BLOCK) + data[at + BLOCK :])
    job = sf.ShardJob(_identity, inputs=str(tmp_path / "in-000.tar"), outputs=str(tmp_path / "out/o-{task}.tar"),
                      decode=None, on_error="skip")
    report = job.run("serial")
    assert report.ok and report.stats.samples_in == 17 and report.stats.samples_out == 17
    assert report.stats.failed == 4  # the damaged region and the three samples next to it


def _identity(sample):
    return sample


# ------------------------------------------------------------------------------------------------
# 2. fields of a damaged header are never trusted


def test_bit_flip_in_the_first_header_gives_no_bogus_key_and_no_partial_sample():
    data, samples = shard(5)
    bad = bytearray(data)
    bad[2] ^= 0x10  # 's000000.cls' -> 's0 0000.cls': the header's checksum no longer matches
    out, errors = read(bytes(bad), url="file:///d/x.tar")
    whole(out, samples)
    assert [s["__key__"] for s in out] == ["s000001", "s000002", "s000003", "s000004"]
    assert not any(e.key and " " in e.key for e in errors)
    assert errors[0].offset == 0 and [e.key for e in errors[1:]] == ["s000000"]


def test_damaged_size_that_lands_on_a_valid_header_is_not_believed():
    # the damaged header of s000003.cls says a size that leads exactly to s000005.cls's header:
    # believing it skipped s000003..s000004 unreported and delivered s000005 whole by luck
    data, samples = shard(8)
    offs = offsets(data)
    at, target = offs[6], offs[10]
    bad = bytearray(data)
    bad[at + 124 : at + 136] = b"%011o\0" % (target - at - BLOCK)  # checksum left stale: damaged
    out, errors = read(bytes(bad))
    whole(out, samples)
    missing = {s["__key__"] for s in samples} - {s["__key__"] for s in out}
    region = errors[0]
    assert region.offset == at and f"offset {offs[7]}" in region.reason  # resumed at s000003.txt
    assert missing == {"s000002", "s000003"} and missing <= {e.key for e in errors}


def test_crafted_size_plus_512_with_a_valid_checksum_delivers_no_padded_member():
    data, samples = shard(6)
    at = offsets(data)[4]  # s000002.cls
    bad = bytearray(data)
    header = bytearray(bad[at : at + BLOCK])
    size = int(header[124:135], 8)
    header[124:136] = b"%011o\0" % (size + BLOCK)
    bad[at : at + BLOCK] = reheader(header)
    with pytest.raises(FormatError) as info:
        read(bytes(bad), "raise")
    assert info.value.offset is not None
    out, errors = read(bytes(bad))
    whole(out, samples)  # s000002 is in the damaged region, its neighbours next to it
    assert [s["__key__"] for s in out] == ["s000000", "s000004", "s000005"]
    assert errors[0].offset == at and "'s000002.cls' does not end where its size field says" in str(errors[0])
    assert [e.key for e in errors[1:]] == ["s000002", "s000001", "s000003"]  # s000002: its header is sound


def test_crafted_size_swallowing_an_empty_member_is_caught_by_the_header_in_its_data():
    # s/1.cls is 512 bytes and s/1.txt empty: a size of 1024 makes s/1.txt's header the data
    members = [("s/0.cls", b"0"), ("s/1.cls", b"1" * 512), ("s/1.txt", b""), ("s/2.cls", b"2"), ("s/3.cls", b"3")]
    data = tar_of(members)
    at = offsets(data)[1]
    bad = bytearray(data)
    header = bytearray(bad[at : at + BLOCK])
    header[124:136] = b"%011o\0" % 1024
    bad[at : at + BLOCK] = reheader(header)
    out, errors = read(bytes(bad))
    assert [s["__key__"] for s in out] == ["s/3"]
    assert "does not end where its size field says" in str(errors[0])


# ------------------------------------------------------------------------------------------------
# 3. parts of one key that are not adjacent


def test_non_adjacent_parts_report_both_parts_and_fail_under_raise():
    data = tar_of([("k/1.cls", b"1"), ("k/2.cls", b"2"), ("k/1.txt", b"late"), ("k/3.cls", b"3")])
    offs = offsets(data)
    with pytest.raises(SampleError, match="reappears"):
        read(data, "raise")
    out, errors = read(data)
    assert [s["__key__"] for s in out] == ["k/1", "k/2", "k/3"]
    (err,) = errors
    assert err.key == "k/1" and err.offset == offs[2] and f"first part (offset {offs[0]})" in err.reason


# ------------------------------------------------------------------------------------------------
# 4. sizes a header claims are never allocated


def _huge(field: bytes) -> bytes:
    data, _ = shard(4)
    at = offsets(data)[3]
    bad = bytearray(data)
    header = bytearray(bad[at : at + BLOCK])
    header[124:136] = field
    bad[at : at + BLOCK] = reheader(header)
    return bytes(bad)


HUGE = {
    "base256-1TiB": b"\x80" + (1 << 40).to_bytes(11, "big"),
    "base256-2**80": b"\x80" + (1 << 80).to_bytes(11, "big"),
    "octal-8GiB": b"77777777777\0",
}


@pytest.mark.parametrize("field", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("how", ["bytes", "file", "gzip"])
def test_huge_declared_size_is_a_format_error_with_offset(field, how, tmp_path):
    data = _huge(field)
    at = offsets(shard(4)[0])[3]
    if how == "gzip":
        data = gzip.compress(data)
    for on_error in ("raise", "skip"):
        if how == "file":
            (tmp_path / "x.tar").write_bytes(data)
            with open(tmp_path / "x.tar", "rb", buffering=1 << 20) as f, pytest.raises(FormatError) as info:
                list(read_samples(f, URL, on_error=on_error, report=lambda e: None))
        else:
            with pytest.raises(FormatError) as info:
                read(data, on_error)
        assert info.value.offset == at and "truncated tar" in str(info.value)


def test_pax_size_of_10_to_the_30():
    pax = bytearray(tarfile.TarInfo("././@PaxHeader").tobuf(tarfile.USTAR_FORMAT))
    pax[156:157] = b"x"
    body = _pax_record("size", str(10**30))
    pax[124:136] = b"%011o\0" % len(body)
    member = bytearray(tarfile.TarInfo("a.bin").tobuf(tarfile.USTAR_FORMAT))
    data = reheader(pax) + body + bytes(-len(body) % BLOCK) + reheader(member) + b"x" * BLOCK + bytes(2 * BLOCK)
    with pytest.raises(FormatError, match="truncated tar") as info:
        read(data, "warn")
    assert info.value.offset == 2 * BLOCK


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def test_huge_size_in_the_training_reader_warns_and_goes_on(tmp_path):
    from shardflow.reader import ShardDataset

    good, _ = shard(3)
    (tmp_path / "a-0.tar").write_bytes(_huge(HUGE["base256-2**80"]))
    (tmp_path / "a-1.tar").write_bytes(good)
    ds = ShardDataset(str(tmp_path / "a-{0..1}.tar"), decode=None, on_error="warn")
    with pytest.warns(ShardflowWarning, match="truncated tar"):
        keys = [s["__key__"] for s in ds]
    assert keys[:1] == ["s000000"] and keys[-3:] == ["s000000", "s000001", "s000002"]
    import torch

    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)  # workers do not crash
    assert sorted(s["__key__"] for s in loader) == sorted(keys)


# ------------------------------------------------------------------------------------------------
# 5. names that are not UTF-8 are data


def latin1_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for name, body in [("caf\xe9/000.txt", b"a"), ("caf\xe9/000.cls", b"1"), ("b/001.txt", b"b")]:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_latin1_names_round_trip_through_a_job(tmp_path):
    import shardflow as sf

    assert stable_seed(0, "caf\udce9/000") == stable_seed(0, "caf\udce9/000")  # no UnicodeEncodeError
    (tmp_path / "in-000.tar").write_bytes(latin1_tar())
    out = tmp_path / "out"
    job = sf.ShardJob(_with_rng, inputs=str(tmp_path / "in-000.tar"), outputs=str(out / "o-{task}.tar"),
                      decode=None, on_error="skip")
    report = job.run("serial")
    assert report.ok and report.stats.failed == 0
    got = [(s["__key__"], s.get("cls"), s["txt"]) for s in read_samples(str(out / "o-0.tar"))]
    assert got == [("caf\udce9/000", b"1", b"a"), ("b/001", None, b"b")]
    with tarfile.open(out / "o-0.tar", encoding="latin-1", errors="surrogateescape") as tf:
        assert tf.getnames()[0].encode("latin-1", "surrogateescape") == b"caf\xe9/000.cls"


def _with_rng(sample):
    import shardflow as sf

    sf.sample_rng(sample).integers(10)
    return sample


# ------------------------------------------------------------------------------------------------
# 6. gzip: every sample decompressed before the damage is delivered


def _webdataset_count(data: bytes, tmp_path) -> int:
    wds = pytest.importorskip("webdataset")
    path = tmp_path / "w.tgz"
    path.write_bytes(data)
    count = 0
    try:
        for _ in wds.WebDataset(str(path), shardshuffle=False, empty_check=False):
            count += 1
    except Exception:  # noqa: BLE001 - webdataset raises whatever tarfile/gzip raise
        pass
    return count


@pytest.mark.parametrize("cut", [0.3, 0.55, 0.8, 0.97])
def test_truncated_tgz_delivers_every_complete_sample(cut, tmp_path):
    data, samples = shard(60, exts=("cls", "txt", "json"))
    gz = gzip.compress(data)
    bad = gz[: int(len(gz) * cut)]
    got: list[str] = []
    with pytest.raises(FormatError, match="corrupt gzip stream|truncated") as info:
        for s in read_samples(io.BytesIO(bad), URL, on_error="skip", report=lambda e: None):
            got.append(s["__key__"])
    # every sample whose members, and the name of the member after them, were decompressed
    good = len(zlib.decompressobj(wbits=31).decompress(bad))
    offs = offsets(data) + [len(data) - 2 * BLOCK]
    provable = sum(1 for i in range(60) if offs[3 * i + 3] + 157 <= good)
    assert got == [s["__key__"] for s in samples[:provable]]
    # webdataset (tarfile) also ends a sample at a header cut before its name: maybe partial
    assert len(got) >= _webdataset_count(bad, tmp_path) - 1
    # the error names the member cut and where the good bytes end (not offset 0, not the last key)
    assert info.value.offset in (offs[3 * provable], offs[3 * provable + 1], offs[3 * provable + 2], good)
    assert info.value.key == samples[provable]["__key__"]


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("where,delivered,named", [
    (0, 3, "s000003"),  # cut where s000004's header starts: s000003 may go on, it is named
    (200, 4, "s000004"),  # cut inside s000004.cls's header, after its name: s000003 ended before
    (BLOCK + 10, 4, "s000004"),  # cut inside s000004.cls's data
    (-300, 3, "s000003"),  # cut inside s000003.txt's data
])
def test_a_cut_delivers_the_sample_in_progress_when_the_member_cut_names_another(where, delivered, named,
                                                                                 compressed):
    data, samples = shard(8)
    cut = offsets(data)[8] + where
    bad = data[:cut]
    if compressed:  # a gzip stream that ends exactly there (flushed, no end): the same must hold
        packer = zlib.compressobj(wbits=31)
        bad = packer.compress(bad) + packer.flush(zlib.Z_SYNC_FLUSH)
    got: list[str] = []
    with pytest.raises(FormatError, match="corrupt gzip stream" if compressed else "truncated tar") as info:
        for s in read_samples(io.BytesIO(bad), URL, on_error="skip", report=lambda e: None):
            got.append(s["__key__"])
    assert got == [s["__key__"] for s in samples[:delivered]] and info.value.key == named


def test_tgz_followed_by_junk_delivers_every_sample_with_a_warning():
    data, samples = shard(30)
    with pytest.warns(ShardflowWarning, match="non-gzip data after the gzip stream"):
        out, errors = read(gzip.compress(data) + b"\x00garbage!")
    assert len(out) == 30 and not errors


def test_big_gzip_member_claiming_100_gib():
    data, _ = shard(3)
    at = offsets(data)[2]
    bad = bytearray(data)
    header = bytearray(bad[at : at + BLOCK])
    header[124:136] = b"\x80" + (100 << 30).to_bytes(11, "big")
    bad[at : at + BLOCK] = reheader(header)
    with pytest.raises(FormatError, match="truncated tar") as info:
        read(gzip.compress(bytes(bad)), "warn")
    assert info.value.offset == at


# ------------------------------------------------------------------------------------------------
# 7. tar --sparse members are rebuilt (GNU and pax formats), never dropped or misnamed


def _sparse_file(path) -> bytes:
    with open(path, "wb") as f:
        f.seek(9000)
        f.write(b"hello" * 300)
        f.seek(200_000)
        f.write(b"world")
        f.truncate(300_000)
    return path.read_bytes()


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt", ["gnu", "pax", "pax-0.1", "pax-0.0"])
def test_gnu_tar_sparse_members(fmt, tmp_path):
    if "GNU tar" not in subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout:
        pytest.skip("needs GNU tar")
    (tmp_path / "k").mkdir()
    body = _sparse_file(tmp_path / "k" / "000.bin")
    (tmp_path / "k" / "000.txt").write_bytes(b"text")
    (tmp_path / "k" / "001.txt").write_bytes(b"next")
    version = ["--sparse-version=" + fmt.split("-")[1]] if "-" in fmt else []
    subprocess.run(["tar", "--sparse", "--format=" + fmt.split("-")[0], *version, "-cf", "s.tar",
                    "k/000.bin", "k/000.txt", "k/001.txt"], cwd=tmp_path, check=True)
    data = (tmp_path / "s.tar").read_bytes()
    if fmt == "pax-0.0":  # repeated records: refused with a clear error, never dropped silently
        with pytest.raises(FormatError, match="sparse"):
            read(data, "raise")
        out, errors = read(data)
        assert [s["__key__"] for s in out] == ["k/001"] and errors[0].key == "k/000"
        return
    out, errors = read(data, "raise")
    assert not errors
    assert [(s["__key__"], s["bin"], s["txt"]) for s in out[:1]] == [("k/000", body, b"text")]
    with tarfile.open(tmp_path / "s.tar") as tf:
        assert tf.extractfile("k/000.bin").read() == body  # as tarfile (and so webdataset) rebuilds it


def test_sparse_member_expanding_beyond_the_limit_is_an_error():
    header = bytearray(tarfile.TarInfo("k/0.bin").tobuf(tarfile.GNU_FORMAT))
    header[156:157] = b"S"
    header[124:136] = b"%011o\0" % 10
    header[386:410] = b"%011o\0" % 0 + b"%011o\0" % 10
    header[483:495] = b"\x80" + (1 << 50).to_bytes(11, "big")
    data = reheader(header) + b"x" * 10 + bytes(502) + tar_of([("k/1.txt", b"1")])
    with pytest.raises(FormatError, match="would expand to"):
        read(data, "raise")
    out, errors = read(data)
    assert [s["__key__"] for s in out] == ["k/1"] and errors[0].key == "k/0"


# ------------------------------------------------------------------------------------------------
# 8. bzip2 and xz


@pytest.mark.parametrize("compress,name", [(bz2.compress, "bzip2"), (lzma.compress, "xz"), (gzip.compress, "gzip")])
def test_bz2_and_xz_shards_are_read_and_errors_name_the_compression(compress, name):
    data, samples = shard(10)
    out, _ = read(compress(data[:4000]) + compress(data[4000:]))  # concatenated streams too
    whole(out, samples)
    assert len(out) == 10
    with pytest.raises(FormatError, match=f"not a tar archive.*{name}-compressed"):
        read(compress(b"not a tar at all\n" * 100))
    bad = compress(data)
    with pytest.raises(FormatError, match=f"corrupt {name} stream"):
        read(bad[: len(bad) // 2])


def test_iter_members_yields_only_members_and_corruptions():
    data, _ = shard(3)
    items = list(iter_members(io.BytesIO(data[:BLOCK] + bytes(BLOCK) + data[2 * BLOCK :]), resync=True))
    assert all(isinstance(x, (Member, Corruption)) for x in items)
