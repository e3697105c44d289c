"""Interoperability, both ways, with the real webdataset 1.0.2 library and with GNU tar."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess

import pytest

from shardflow.shards.keys import split_name
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_read import iter_members
from shardflow.shards.writer import ShardWriter, TarWriter

wds = pytest.importorskip("webdataset")
TAR = shutil.which("tar")
needs_tar = pytest.mark.skipif(TAR is None, reason="GNU tar is not installed")

LONG_DIR = "deep-" + "d" * 70 + "/" + "e" * 60


def rich_samples(n=30):
    """Samples with the shapes that break readers: long and unicode keys, dotted dirs, empty members."""
    out = []
    for i in range(n):
        if i % 5 == 0:
            key = f"{LONG_DIR}/{i:06d}"  # member names > 100 bytes: pax headers
        elif i % 5 == 1:
            key = f"données/ünïcode-{i:06d}"  # non-ASCII: pax headers
        elif i % 5 == 2:
            key = f"a.b/c.d/{i:06d}"  # dots in directory names
        else:
            key = f"plain/{i:06d}"
        out.append({
            "__key__": key,
            "jpg": hashlib.sha256(b"%d" % i).digest() * (40 + 37 * i),
            "json": json.dumps({"i": i}).encode(),
            "seg.png": os.urandom(i * 13),
            "txt": b"" if i % 3 == 0 else b"t%d" % i,  # empty members
        })
    return out


def strip(sample):
    return {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}


# ------------------------------------------------------------------------------------------------
# webdataset reads what we write


def test_webdataset_reads_our_shards_sample_for_sample(tmp_path):
    samples = rich_samples()
    with ShardWriter(str(tmp_path / "ours-%03d.tar"), maxcount=12) as w:
        for s in samples:
            w.write(s)
    urls = [i.url for i in w.shards]
    assert len(urls) == 3
    ds = wds.WebDataset(urls, shardshuffle=False)
    theirs = [strip(s) for s in ds]
    assert theirs == samples  # keys, extensions and bytes, in order
    # webdataset's lower-level pipeline too
    flat = [strip(s) for s in wds.tarfile_to_samples()([{"url": u} for u in urls])]
    assert flat == samples


def test_webdataset_decodes_what_our_encoder_wrote(tmp_path):
    codecs = pytest.importorskip("shardflow.codecs")
    import numpy as np

    url = str(tmp_path / "enc.tar")
    image = (np.arange(8 * 8 * 3) % 255).astype(np.uint8).reshape(8, 8, 3)
    with TarWriter(url, encoder=codecs.Encoder()) as w:
        w.write({"__key__": "x", "json": {"a": [1, 2]}, "cls": 7, "txt": "héllo", "png": image})
    (s,) = list(wds.WebDataset(url, shardshuffle=False).decode("rgb8"))
    assert s["json"] == {"a": [1, 2]} and s["cls"] == 7 and s["txt"] == "héllo"
    assert (s["png"] == image).all()


# ------------------------------------------------------------------------------------------------
# we read what webdataset writes


def test_we_read_webdataset_tarwriter_and_shardwriter(tmp_path):
    samples = rich_samples(20)
    url = str(tmp_path / "theirs.tar")
    with wds.TarWriter(url) as w:
        for s in samples:
            w.write(s)
    ours = [strip(s) for s in read_samples(url)]
    expected = [strip(s) for s in wds.WebDataset(url, shardshuffle=False)]
    assert ours == expected == [{k: s[k] for k in s} for s in samples]

    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=7, verbose=0) as sw:
        for s in samples:
            sw.write(s)
    shards = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    assert len(shards) == 3
    assert [strip(s) for u in shards for s in read_samples(u)] == samples


def test_we_read_webdataset_encoded_and_gzipped_shards(tmp_path):
    url = str(tmp_path / "theirs.tgz")
    with wds.TarWriter(url, compress=True) as w:
        for i in range(10):
            w.write({"__key__": f"k{i:03d}", "json": {"i": i}, "cls": i, "txt": f"t{i}"})
    with open(url, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    ours = [strip(s) for s in read_samples(url)]
    theirs = [strip(s) for s in wds.WebDataset(url, shardshuffle=False)]
    assert ours == theirs and len(ours) == 10
    assert json.loads(ours[3]["json"]) == {"i": 3} and ours[3]["cls"] == b"3"


def test_key_rule_matches_webdataset_exhaustively():
    base_plus_ext = wds.tariterators.base_plus_ext
    checked = 0
    for n in range(1, 8):
        for chars in itertools.product("aZ./", repeat=n):
            name = "".join(chars)
            key, ext = base_plus_ext(name)
            ours = split_name(name)
            if key is not None:
                assert ours == (key, ext.lower()), name
                checked += 1
            elif not name.rsplit("/", 1)[-1].startswith("."):
                assert ours[1] == "", name  # webdataset skips it: we see no extension (and report it)
    assert checked > 1000


# ------------------------------------------------------------------------------------------------
# GNU tar reads what we write


@needs_tar
def test_gnu_tar_lists_and_extracts_our_shards(tmp_path):
    samples = rich_samples(15)
    url = str(tmp_path / "ours.tar")
    with TarWriter(url) as w:
        for s in samples:
            w.write(s)
    names = subprocess.run([TAR, "tf", url], check=True, capture_output=True, text=True).stdout.splitlines()
    expected = [f"{s['__key__']}.{ext}" for s in samples for ext in sorted(e for e in s if not e.startswith("__"))]
    assert names == expected
    listing = subprocess.run([TAR, "tvf", url], check=True, capture_output=True, text=True,
                             env={**os.environ, "TZ": "UTC"}).stdout.splitlines()
    assert all(line.startswith("-r--r--r-- 0/0") and "1970-01-01 00:00" in line for line in listing), listing[:2]
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run([TAR, "xf", url, "-C", str(out)], check=True)
    for s in samples:
        for ext, data in s.items():
            if not ext.startswith("__"):
                assert (out / f"{s['__key__']}.{ext}").read_bytes() == data


# ------------------------------------------------------------------------------------------------
# we read what GNU tar writes


def make_tree(root):
    files = {
        "a.b/c.d/000001.jpg": os.urandom(3000),
        "a.b/c.d/000001.json": b'{"k": 1}',
        "a.b/c.d/000002.jpg": os.urandom(10),
        "x/y/z/000003.txt": b"nested",
        "x/y/z/000003.cls": b"3",
        f"{LONG_DIR}/000004.seg.png": os.urandom(777),  # > 100 chars
        f"{LONG_DIR}/000004.txt": b"long",
        "e/000005.txt": b"",  # empty member
        "e/000005.cls": b"",
        "e/000006.json": b"[]",
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@needs_tar
@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tgz"])
def test_we_read_gnu_tar_archives(tmp_path, fmt, gz):
    src = tmp_path / "src"
    files = make_tree(src)
    out = tmp_path / ("t.tgz" if gz else "t.tar")
    flags = "-czf" if gz else "-cf"
    subprocess.run([TAR, f"--format={fmt}", "--sort=name", flags, str(out), "-C", str(src),
                    "a.b", "e", "x", "deep-" + "d" * 70],
                   check=True, capture_output=True)
    listed = subprocess.run([TAR, "tf", str(out)], check=True, capture_output=True, text=True).stdout.splitlines()
    assert any(n.endswith("/") for n in listed), "tar should have stored directory entries"
    regular = [n for n in listed if not n.endswith("/")]
    with open(out, "rb") as f:
        members = [(m.name, m.data) for m in iter_members(f)]
    assert members == [(n, files[n]) for n in regular]  # directories skipped, nothing else lost
    if fmt == "gnu" and not gz:
        assert b"././@LongLink" in out.read_bytes()
    samples = list(read_samples(str(out)))
    by_key = {s["__key__"]: s for s in samples}
    assert len(samples) == 6
    assert by_key["a.b/c.d/000001"]["json"] == b'{"k": 1}'
    assert by_key[f"{LONG_DIR}/000004"]["seg.png"] == files[f"{LONG_DIR}/000004.seg.png"]
    assert by_key["e/000005"] == {"__key__": "e/000005", "__url__": str(out), "txt": b"", "cls": b""}


@needs_tar
def test_we_read_gnu_tar_with_dot_slash_names_and_unicode(tmp_path):
    src = tmp_path / "src"
    (src / "ü").mkdir(parents=True)
    (src / "ü" / "ñ-1.txt").write_bytes(b"u")
    (src / "ü" / "ñ-1.json").write_bytes(b"{}")
    out = tmp_path / "u.tar"
    subprocess.run([TAR, "--format=pax", "--sort=name", "-cf", str(out), "-C", str(src), "."], check=True)
    samples = list(read_samples(str(out)))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("./ü/ñ-1", ["json", "txt"])]
    # webdataset agrees on the same archive
    assert [s["__key__"] for s in wds.WebDataset(str(out), shardshuffle=False)] == ["./ü/ñ-1"]
