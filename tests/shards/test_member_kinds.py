"""Members the reader meets and what becomes of them: every extension it reads is one the writer takes
(keys.check_ext, one rule for both), links and special files are reported (never left out silently),
and its warnings name the shard escaped (text.safe)."""

from __future__ import annotations

import gzip
import io
import tarfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardflow.errors import SampleError, ShardflowWarning
from shardflow.shards.keys import check_ext, check_key, split_name
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter


def _tar(path: Path, *members: tarfile.TarInfo | tuple[str, bytes]) -> Path:
    """A tar made by Python's tarfile (GNU format): (name, bytes) regular files, or TarInfo entries as given."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def _entry(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


# -- one extension rule for reader and writer --------------------------------------------------------
_NAME_PART = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"), min_size=1, max_size=8)


@given(st.lists(_NAME_PART, min_size=1, max_size=3), _NAME_PART)
def test_every_member_name_the_reader_splits_is_written_back_the_same(folders, basename):
    key, ext = split_name("/".join([*folders[:-1], basename]))
    if check_key(key) is not None or not ext:
        return  # the reader reports these (hidden files, no extension) or the key is refused as hostile
    assert check_ext(ext) is None
    assert split_name(f"{key}.{ext}") == (key, ext)


@pytest.mark.parametrize("ext", ["", "a/b", "T", "x\0y", 3])
def test_extensions_that_would_read_back_otherwise_are_refused(ext):
    assert check_ext(ext) is not None


def test_a_member_with_a_dot_after_the_key_round_trips(tmp_path):
    shard = _tar(tmp_path / "in.tar", ("a.txt", b"1"), ("b..txt", b"2"), ("c.txt", b"3"))
    samples = list(read_samples(str(shard)))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("a", ["txt"]), ("b", [".txt"]), ("c", ["txt"])]
    with TarWriter(str(tmp_path / "out.tar")) as writer:
        for sample in samples:
            writer.write(sample)
    with tarfile.open(tmp_path / "out.tar") as tar:
        assert tar.getnames() == ["a.txt", "b..txt", "c.txt"]


# -- links and special files -------------------------------------------------------------------------
def _linked(tmp_path: Path) -> Path:
    return _tar(tmp_path / "links.tar", ("a.txt", b"data"), ("a.json", b"{}"),
                _entry("b.txt", tarfile.LNKTYPE, "a.txt"), _entry("c.txt", tarfile.SYMTYPE, "a.txt"),
                _entry("d", tarfile.DIRTYPE), _entry("e.fifo", tarfile.FIFOTYPE), ("f.txt", b"f"))


def test_links_and_special_members_are_reported_once_each_and_the_rest_kept(tmp_path):
    shard = _linked(tmp_path)
    reports: list[SampleError] = []
    samples = list(read_samples(str(shard), on_error="skip", report=reports.append))
    assert [s["__key__"] for s in samples] == ["a", "f"]
    assert [(type(r), r.url, r.key) for r in reports] == [(SampleError, str(shard), k) for k in ("b", "c", "e")]
    assert "member 'b.txt' is a hard link to 'a.txt'" in str(reports[0])
    assert "member 'c.txt' is a symbolic link to 'a.txt'" in str(reports[1])
    assert "member 'e.fifo' is a FIFO" in str(reports[2])  # the directory `d` is no sample: not reported


def test_a_link_stops_a_strict_read_naming_shard_key_and_member(tmp_path):
    shard = _linked(tmp_path)
    with pytest.raises(SampleError) as caught:
        list(read_samples(str(shard)))
    assert str(caught.value).startswith(f"shard {shard}, key 'b', offset ")
    assert "'b.txt' is a hard link" in str(caught.value)


def test_a_gnu_tar_hard_link_is_reported(tmp_path):
    import shutil
    import subprocess

    if shutil.which("tar") is None:
        pytest.skip("no tar command here")
    folder = tmp_path / "hl"
    folder.mkdir()
    (folder / "a.txt").write_text("data\n")
    (folder / "b.txt").hardlink_to(folder / "a.txt")
    (folder / "a.json").write_text("j\n")
    subprocess.run(["tar", "-cf", str(tmp_path / "hl.tar"), "-C", str(folder), "a.txt", "a.json", "b.txt"], check=True)
    reports: list[SampleError] = []
    samples = read_samples(str(tmp_path / "hl.tar"), on_error="skip", report=reports.append)
    assert [s["__key__"] for s in samples] == ["a"]
    assert len(reports) == 1 and reports[0].key == "b" and "hard link to 'a.txt'" in reports[0].reason


# -- warnings: the shard's name escaped ---------------------------------------------------------------
def test_warnings_about_trailing_data_escape_the_shard_name(tmp_path):
    plain = _tar(tmp_path / "plain", ("a.txt", b"1")).read_bytes()
    shards = {tmp_path / "y\x1b[31mRED.tar": plain + b"junk",
              tmp_path / "z\x1b[31mRED.tar.gz": gzip.compress(plain) + b"junk"}
    for path, data in shards.items():
        path.write_bytes(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert [s["__key__"] for s in read_samples(str(path))] == ["a"]
        messages = [str(w.message) for w in caught if issubclass(w.category, ShardflowWarning)]
        assert len(messages) == 1, messages
        assert "\x1b" not in messages[0] and path.name.replace("\x1b", "\\x1b") in messages[0], messages
