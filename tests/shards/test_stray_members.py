"""Members that belong to no sample (macOS `._*`, hidden files, no extension) are left out and reported,
never a failed sample; and under raise, the samples whole before a bad member are delivered first."""

from __future__ import annotations

import io
import tarfile
import warnings

import pytest

from shardflow.errors import SampleError, ShardflowError, ShardflowWarning, StrayMember
from shardflow.shards.samples import read_samples, strays_once
from tests.support.tar_corruption import tar_of

URL = "mac.tar"
# a tar made on macOS: an AppleDouble `._name` beside every file
MAC = [m for i in range(6) for m in ((f"._s{i}.jpg", b"META"), (f"s{i}.jpg", b"J%d" % i), (f"s{i}.cls", b"%d" % i))]


def _read(data: bytes, **kw) -> list[str]:
    return [s["__key__"] for s in read_samples(io.BytesIO(data), URL, **kw)]


def test_a_macos_tar_reads_whole_under_raise_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _read(tar_of(MAC)) == [f"s{i}" for i in range(6)]
    [warning] = [w for w in caught if issubclass(w.category, ShardflowWarning)]  # once per shard, not 6 times
    assert "'._s0.jpg'" in str(warning.message) and "belongs to no sample" in str(warning.message)


@pytest.mark.parametrize("on_error", ["raise", "skip", "warn"])
def test_each_stray_member_is_reported_not_raised(on_error):
    reported: list[ShardflowError] = []
    members = [("x.jpg", b"X"), ("noext", b"N"), (".hidden.txt", b"H"), ("y.jpg", b"Y")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _read(tar_of(members), on_error=on_error, report=reported.append) == ["x", "y"]
    assert [type(e) for e in reported] == [StrayMember, StrayMember]
    assert "'noext'" in str(reported[0]) and "'.hidden.txt'" in str(reported[1]) and URL in str(reported[1])


def test_strays_once_tells_a_tool_of_the_first_stray_member_only():
    shown: list[ShardflowError] = []
    _read(tar_of(MAC + [("z.txt", b"z"), ("z.txt", b"dup")]), on_error="skip", report=strays_once(shown.append))
    assert len(shown) == 2 and "'._s0.jpg'" in str(shown[0]) and "without a warning" in str(shown[0])
    assert isinstance(shown[1], SampleError) and "duplicate extension" in str(shown[1])  # other problems pass


def _with_link(name: str, before: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key in before:
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo(name)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        tail = tarfile.TarInfo("s9.txt")
        tail.size = 1
        tar.addfile(tail, io.BytesIO(b"x"))
    return buf.getvalue()


def _until_error(data: bytes) -> tuple[list[str], SampleError]:
    got: list[str] = []
    with pytest.raises(SampleError) as info:
        for sample in read_samples(io.BytesIO(data), URL):
            got.append(sample["__key__"])
    return got, info.value


def test_raise_delivers_the_whole_samples_before_a_bad_member_first():
    got, error = _until_error(_with_link("s5.txt", ["s0", "s1", "s2", "s3", "s4"]))
    assert got == ["s0", "s1", "s2", "s3", "s4"] and "symbolic link" in str(error)  # s3, s4 were lost


def test_raise_keeps_back_the_sample_a_bad_member_belongs_to():
    got, _ = _until_error(_with_link("s4.cls", ["s0", "s1", "s2", "s3", "s4"]))  # a link in s4: s4 is not whole
    assert got == ["s0", "s1", "s2", "s3"]


def test_raise_delivers_the_sample_before_a_key_that_reappears():
    data = tar_of([(f"s{i}.txt", b"%d" % i) for i in range(4)] + [("s1.cls", b"late"), ("s4.txt", b"4")])
    got, error = _until_error(data)
    assert got == ["s0", "s1", "s2", "s3"] and "reappears" in str(error)  # s3 is whole: it comes out first
