"""`shardflow create`: from a directory tree (as `tar --sort=name` groups it) and from a recipe."""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

from click.testing import CliRunner

import shardflow as sf
from shardflow.cli import main


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def tree(root: Path, samples: int) -> None:
    for i in range(samples):
        folder = root / f"d{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.txt").write_bytes(b"t%d" % i)
        (folder / f"{i:05d}.cls").write_bytes(b"%d" % (i % 10))
    (root / ".hidden").write_text("never packed")


def test_create_from_a_directory_of_thousands_of_small_files_matches_tar(tmp_path):
    tree(tmp_path / "src", 1500)  # 3000 files
    started = time.perf_counter()
    result = run("create", tmp_path / "src", "-o", tmp_path / "out" / "data-{part:04d}.tar", "--maxcount", 1000,
                 "--jobs", 8)
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert elapsed < 30
    shards = sorted((tmp_path / "out").glob("*.tar"))
    assert [p.name for p in shards] == ["data-0000.tar", "data-0001.tar"]
    samples = [s for p in shards for s in sf.read_samples(str(p))]
    assert len(samples) == 1500
    folders = sorted(p.name for p in (tmp_path / "src").iterdir() if not p.name.startswith("."))
    listing = subprocess.run(["tar", "--sort=name", "-cf", "-", *folders], cwd=tmp_path / "src",
                             capture_output=True, check=True).stdout
    names = subprocess.run(["tar", "-tf", "-"], input=listing, capture_output=True, check=True).stdout.decode()
    files = [n for n in names.split() if not n.endswith("/")]
    ours = [f"{s['__key__']}.{ext}" for s in samples for ext in sorted(k for k in s if not k.startswith("__"))]
    assert ours == files  # the same members in the same order as tar --sort=name
    assert samples[0]["txt"] == b"t0" and samples[0]["__key__"] == "d0/00000"


def test_create_is_deterministic_with_shuffle_and_index_keys(tmp_path):
    tree(tmp_path / "src", 50)
    digests = []
    for attempt in range(2):
        out = tmp_path / f"o{attempt}.tar"
        result = run("create", tmp_path / "src", "-o", out, "--shuffle", "--seed", 3, "--keys", "index")
        assert result.exit_code == 0, result.output
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    samples = list(sf.read_samples(str(tmp_path / "o0.tar")))
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(50)]
    order = [int(s["txt"][1:]) for s in samples]
    assert order != sorted(order) and sorted(order) == list(range(50))
    other = run("create", tmp_path / "src", "-o", tmp_path / "o9.tar", "--shuffle", "--seed", 4, "--keys", "index")
    assert other.exit_code == 0 and (tmp_path / "o9.tar").read_bytes() != (tmp_path / "o0.tar").read_bytes()


def test_create_from_a_recipe_with_text_files_and_pipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # stdin's recipe reads under the current directory
    (tmp_path / "img.bin").write_bytes(b"\x00\x01binary")
    recipe = (f"a/001.txt\ttext:hello\\nworld\n# a comment\n\na/001.bin {tmp_path / 'img.bin'}\n"
              f"a/002.txt\tfile://{tmp_path / 'img.bin'}\na/003.txt pipe:echo piped\n")
    refused = run("create", "-", "-o", tmp_path / "r.tar", input=recipe)
    assert refused.exit_code == 2 and "--allow-pipe" in refused.output and "line 6" in refused.output
    assert not (tmp_path / "r.tar").exists()
    result = run("create", "-", "-o", tmp_path / "r.tar", "--allow-pipe", input=recipe)
    assert result.exit_code == 0, result.output
    samples = {s["__key__"]: s for s in sf.read_samples(str(tmp_path / "r.tar"))}
    assert samples["a/001"]["txt"] == b"hello\nworld" and samples["a/001"]["bin"] == b"\x00\x01binary"
    assert samples["a/002"]["txt"] == b"\x00\x01binary" and samples["a/003"]["txt"] == b"piped\n"


def test_create_errors_name_the_member_and_leave_nothing(tmp_path):
    missing = run("create", "-", "-o", tmp_path / "m.tar", "--allow-outside",
                  input="a/1.txt text:x\na/2.txt /no/such/file\n")
    assert missing.exit_code == 1
    assert "key 'a/2'" in missing.output and "/no/such/file" in missing.output
    assert not (tmp_path / "m.tar").exists() and not list(tmp_path.glob(".m.tar*"))
    again = run("create", "-", "-o", tmp_path / "n.tar", input="a/1.txt text:x\nb/1.txt text:y\na/1.cls text:1\n")
    assert again.exit_code == 2 and "appears again" in again.output
    bad = run("create", "-", "-o", tmp_path / "n.tar", input="just-one-column\n")
    assert bad.exit_code == 2 and "line 1" in bad.output
    full = run("create", "-", "-o", tmp_path / "one.tar", "--maxcount", 1, input="a/1.txt text:x\na/2.txt text:y\n")
    assert full.exit_code == 1 and "names one shard" in full.output and not (tmp_path / "one.tar").exists()


def test_create_from_a_remote_folder_and_remote_sources(tmp_path):
    """fsspec sources (memory:// here: the same code path as s3:// or gs://): a folder listed once,
    a recipe naming remote objects, shards written to the store."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for i in range(20):
        fs.pipe(f"/h13src/p/{i:03d}.txt", b"t%d" % i)
        fs.pipe(f"/h13src/p/{i:03d}.json", b'{"i": %d}' % i)
    fs.pipe("/h13src/p/.hidden", b"no")
    try:
        result = run("create", "memory://h13src", "-o", "memory://h13out/x-{part:03d}.tar", "--maxcount", 8)
        assert result.exit_code == 0, result.output
        assert sorted(fs.ls("/h13out", detail=False)) == [f"/h13out/x-{i:03d}.tar" for i in range(3)]
        samples = [s for i in range(3) for s in sf.read_samples(f"memory://h13out/x-{i:03d}.tar")]
        assert [s["__key__"] for s in samples] == [f"p/{i:03d}" for i in range(20)]
        assert samples[5]["json"] == b'{"i": 5}'
        fs.pipe("/h13src/recipe.tsv", b"a/1.txt\tmemory://h13src/p/001.txt\na/1.cls\ttext:1\n")
        recipe = run("create", "memory://h13src/recipe.tsv", "--recipe", "-o", tmp_path / "r.tar")
        assert recipe.exit_code == 0, recipe.output
        assert list(sf.read_samples(str(tmp_path / "r.tar")))[0]["txt"] == b"t1"
    finally:
        fs.rm("/h13src", recursive=True)
        fs.rm("/h13out", recursive=True)


def test_create_writes_the_bytes_the_shard_writer_writes(tmp_path):
    """create hands its reads to ShardWriter.write_batch: the shards must be those ShardWriter.write
    makes of the same samples (extensions sorted and lower-cased, pax for long or non-ASCII names,
    big members, rollover)."""
    src = tmp_path / "src"
    deep = src / ("long" * 30)
    deep.mkdir(parents=True)
    (src / "x.TXT").write_bytes(b"upper")
    (src / "x.jpg").write_bytes(bytes(range(256)) * 200)
    (src / "x.seg.png").write_bytes(b"")
    (deep / "k.cls").write_bytes(b"1")
    (src / "ünï.txt").write_bytes(b"u" * 512)
    recipe = "".join(f"r/{i:03d}.{ext} text:{'v' * (i * 37 % 900)}\n" for i in range(40) for ext in ("txt", "cls"))
    (tmp_path / "recipe.tsv").write_text("r/zzz.json text:{}\nr/zzz.cls text:9\n" + recipe)
    for source in (src, tmp_path / "recipe.tsv"):
        result = run("create", source, "-o", tmp_path / "c" / "{part:03d}.tar", "--maxsize", 20_000)
        assert result.exit_code == 0, result.output
        made = sorted((tmp_path / "c").iterdir())
        samples = [s for p in made for s in sf.read_samples(str(p))]
        with sf.ShardWriter(str(tmp_path / "w" / "{shard:03d}.tar"), maxsize=20_000) as writer:
            for sample in samples:
                writer.write({k: v for k, v in sample.items() if k != "__url__"})
        assert [p.read_bytes() for p in made] == [open(i.url, "rb").read() for i in writer.shards]
        assert len(made) > 1
        for folder in ("c", "w"):
            for p in (tmp_path / folder).iterdir():
                p.unlink()


def test_create_refuses_members_the_writer_cannot_write_before_writing_anything(tmp_path):
    cases = {
        "a/1.txt text:x\na/1.TXT text:y\n": "member 'a/1.TXT': sample 'a/1' already has a 'txt' member",
        "a/1..txt text:x\n": "member 'a/1..txt': bad extension '.txt'",
        "a/1. text:x\n": "member 'a/1.': no extension",
    }
    for recipe, message in cases.items():
        result = run("create", "-", "-o", tmp_path / "x.tar", input=recipe)
        assert result.exit_code == 2 and message in result.output, result.output
        assert list(tmp_path.iterdir()) == []


def test_read_batch_reads_every_kind_of_local_path(tmp_path, monkeypatch):
    """Plain paths are opened relative to their folder from the second file in a row in it: relative
    names, alternating folders, links and a missing file after good ones read as by whole path."""
    import pytest

    from shardflow.errors import ShardIOError
    from shardflow.tools.create import PlannedSample, read_batch

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        for i in range(3):
            (tmp_path / folder / f"{i}.txt").write_bytes(f"{folder}{i}".encode() * (30_000 * i + 1))
    (tmp_path / "top.txt").write_bytes(b"top")
    (tmp_path / "b" / "link.txt").symlink_to(tmp_path / "a" / "2.txt")
    monkeypatch.chdir(tmp_path)
    order = ["a/0.txt", "a/1.txt", "b/0.txt", "a/2.txt", "a/0.txt", "top.txt", f"{tmp_path}/b/1.txt",
             f"{tmp_path}/b/2.txt", "b/link.txt", "text:inline"]
    chunk = [PlannedSample(f"k/{i}", (("txt", path),)) for i, path in enumerate(order)]
    got = read_batch(chunk, None)
    expected = [Path(p).read_bytes() if not p.startswith("text:") else b"inline" for p in order]
    assert got == [[(f"k/{i}.txt", data)] for i, data in enumerate(expected)]
    missing = chunk[:2] + [PlannedSample("k/x", (("cls", "a/1.txt"), ("txt", "a/nope.txt")))]
    with pytest.raises(ShardIOError, match="member 'txt': cannot read source 'a/nope.txt': FileNotFoundError"):
        read_batch(missing, None)


def test_inline_batches_of_big_files_are_cut_short_and_lose_nothing(tmp_path, monkeypatch):
    from shardflow.tools import create

    for i in range(10):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * 1000)
    samples = create.group_samples(create.plan_directory(str(tmp_path)))
    assert len(create.read_batch(samples, None, max_bytes=2500)) == 3  # the third brings it to 3000
    monkeypatch.setattr(create, "_INLINE_BYTES", 2500)
    batches = list(create.read_batches(samples, None, jobs=0, batch=256))
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert [m for b in batches for m in b] == [[(f"{i}.bin", bytes([i]) * 1000)] for i in range(10)]


def test_directory_order_is_tars_where_folder_names_share_a_prefix(tmp_path):
    # A plain string sort puts 'a.b/y' and 'a-c/z' before 'a/x' ('-' < '.' < '/'); tar walks each folder's
    # entries in name order, depth first.
    src = tmp_path / "src"
    for rel in ("a/x.txt", "a/x.cls", "a.b/y.txt", "a-c/z.txt", "a/b/w.txt", "ab.txt"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(rel.encode())
    result = run("create", src, "-o", tmp_path / "out.tar")
    assert result.exit_code == 0, result.output
    listing = subprocess.run(["tar", "--sort=name", "-cf", "-", "-C", str(src), "."], capture_output=True,
                             check=True).stdout
    names = subprocess.run(["tar", "-tf", "-"], input=listing, capture_output=True, check=True).stdout.decode()
    files = [n.removeprefix("./") for n in names.split() if not n.endswith("/")]
    samples = list(sf.read_samples(str(tmp_path / "out.tar")))
    ours = [f"{s['__key__']}.{ext}" for s in samples for ext in sorted(k for k in s if not k.startswith("__"))]
    assert ours == files
    assert files.index("a/x.cls") < files.index("a.b/y.txt")
