"""`shardflow create`'s member order: a tree's members grouped by sample key (local and remote trees),
a recipe's order the user's, with the line to move named when a sample's lines are apart."""

from __future__ import annotations

import subprocess

from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

import shardflow as sf
from shardflow.cli import main
from shardflow.shards.keys import split_name
from shardflow.tools.create import sample_order

# tar --sort=name puts the folder `img.masks/` (and `a.k/`) between a sample's files: `img.jpg img.json
# img.masks/0.png img.txt`; create must keep `img.jpg img.json img.txt` one sample.
LAYOUT = ["img.jpg", "img.json", "img.masks/0.png", "img.masks/1.png", "img.txt", "a.jpg", "a.txt", "a.k/x.jpg"]
EXPECTED = [("a", ["jpg", "txt"]), ("a.k/x", ["jpg"]), ("img", ["jpg", "json", "txt"]),
            ("img.masks/0", ["png"]), ("img.masks/1", ["png"])]


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def shown(path: str) -> list[tuple[str, list[str]]]:
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in sf.read_samples(path)]


def test_a_tree_whose_folders_start_like_its_files_packs_each_sample_whole(tmp_path):
    src = tmp_path / "tree"
    for rel in LAYOUT:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    outputs = []
    for attempt in range(2):
        result = run("create", src, "-o", tmp_path / f"t{attempt}.tar")
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / f"t{attempt}.tar").read_bytes())
    assert outputs[0] == outputs[1]  # deterministic
    assert shown(str(tmp_path / "t0.tar")) == EXPECTED
    names = subprocess.run(["tar", "-tf", str(tmp_path / "t0.tar")], capture_output=True, check=True,
                           text=True).stdout.split()
    assert names == ["a.jpg", "a.txt", "a.k/x.jpg", "img.jpg", "img.json", "img.txt", "img.masks/0.png",
                     "img.masks/1.png"]


def test_a_remote_tree_is_ordered_the_same_way():
    import fsspec

    fs = fsspec.filesystem("memory")
    for rel in LAYOUT:
        fs.pipe(f"/order-src/{rel}", rel.encode())
    try:
        result = run("create", "memory://order-src", "-o", "memory://order-out/x.tar")
        assert result.exit_code == 0, result.output
        assert shown("memory://order-out/x.tar") == EXPECTED
    finally:
        for folder in ("/order-src", "/order-out"):
            if fs.exists(folder):
                fs.rm(folder, recursive=True)


def test_a_recipe_with_a_sample_apart_names_the_line_to_move(tmp_path):
    (tmp_path / "r.tsv").write_text("a.jpg\ttext:1\n# comment\nb.txt\ttext:2\na.txt\ttext:3\n")
    result = run("create", tmp_path / "r.tsv", "-o", tmp_path / "r.tar")
    assert result.exit_code == 2
    assert (f"recipe {tmp_path / 'r.tsv'}, line 4: member 'a.txt': sample 'a' appears again after other samples "
            "(it began on line 1)" in result.output and "move this line next to line 1" in result.output), result.output
    assert not (tmp_path / "r.tar").exists()


NAME_PART = st.text(alphabet="ab.-", min_size=1, max_size=3).filter(lambda p: not p.startswith("."))


@given(st.sets(st.lists(NAME_PART, min_size=1, max_size=3).map("/".join), min_size=1, max_size=12))
@example({"a.a", "a.b/c.d", "a.c"})  # tar's order: a.a a.b/c.d a.c
def test_sample_order_keeps_samples_whole_and_is_tars_where_tar_does(names):
    """Any set of file names: each key's members form one run (what group_samples needs), and where
    `tar --sort=name`'s order (a folder's entries by name, depth first) already does, it is that order."""
    files = [n for n in names if not any(m.startswith(f"{n}/") for m in names)]  # a file is not a folder too
    ordered = [n for n, _ in sample_order([(n, n) for n in files])]
    assert sorted(ordered) == sorted(files)
    keys = [split_name(n)[0] for n in ordered]
    assert len([k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]) == len(set(keys)), keys
    tar = sorted(files, key=lambda n: n.split("/"))  # tar --sort=name: by path components
    tar_keys = [split_name(n)[0] for n in tar]
    if len([k for i, k in enumerate(tar_keys) if i == 0 or tar_keys[i - 1] != k]) == len(set(tar_keys)):
        assert ordered == tar
