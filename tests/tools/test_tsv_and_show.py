"""`shardflow tsv` (tsv/csv/jsonl/parquet round trips) and `shardflow show` (a PNG contact sheet)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardflow as sf
from shardflow.cli import main
from shardflow.cli import tools_sheet as inline
from shardflow.tools import sheet

COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (128, 128, 128)]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def png(color, size=(40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "d.tar"
    with sf.TarWriter(str(path)) as w:
        for i, color in enumerate(COLORS):
            sample = {"__key__": f"img/{i:03d}", "png": png(color), "cls": b"%d" % (i % 3),
                      "json": json.dumps({"label": f"c{i}", "box": [i, i + 1], "tab": "a\tb"}).encode()}
            if i == 4:
                del sample["png"]  # no image: skipped by show
            w.write(sample)
    return path


def test_tsv_to_stdout_with_fields_and_escapes(shard):
    result = run("tsv", shard, "-f", "cls", "-f", "json.label", "-f", "json.box.1", "-f", "json.tab", "-f", "png")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "key\turl\tcls\tjson.label\tjson.box.1\tjson.tab\tpng"
    first = lines[1].split("\t")
    assert first[0] == "img/000" and first[2:6] == ["0", "c0", "1", "a\\tb"] and int(first[6]) > 0
    assert len(lines) == 8 and lines[5].split("\t")[6] == ""  # img/004 has no png


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_table_formats_round_trip(shard, tmp_path, fmt):
    out = tmp_path / f"meta.{fmt}"
    result = run("tsv", shard, "-f", "cls", "-f", "json.label", "-f", "json.box", "--format", fmt, "-o", out)
    assert result.exit_code == 0, result.output
    if fmt == "csv":
        rows = list(csv.DictReader(out.open()))
        got = [(r["key"], r["cls"], r["json.label"], json.loads(r["json.box"])) for r in rows]
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        got = [(r["key"], r["cls"], r["json.label"], r["json.box"]) for r in rows]
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(out).to_pylist()
        got = [(r["key"], r["cls"], r["json.label"], r["json.box"]) for r in table]
    assert got == [(f"img/{i:03d}", str(i % 3), f"c{i}", [i, i + 1]) for i in range(len(COLORS))]
    assert run("tsv", shard, "--format", "parquet").exit_code == 2  # parquet needs -o


def test_tsv_escapes_hostile_keys_on_a_terminal(tmp_path):
    from tests.cli.test_terminal_output import on_terminal

    with sf.TarWriter(str(tmp_path / "h.tar")) as w:
        w.write({"__key__": "evil\x1b]0;pwned\x07", "txt": b"x"})
    status, shown, _ = on_terminal("tsv", tmp_path / "h.tar", "-f", "txt", cwd=tmp_path)
    assert status == 0 and b"\x1b" not in shown and b"\\x1b]0;pwned\\x07" in shown


CAPTION = ("family \U0001F468\u200d\U0001F469, \u05e9\u05dc\u05d5\u05dd\u200f, soft\xadhyphen, a\\x1b, "
           "tab\there\nline\rend")


def _unescape_tsv(cell: str) -> str:
    out, i = [], 0
    while i < len(cell):
        if cell[i] == "\\":
            out.append({"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}[cell[i + 1]])
            i += 2
        else:
            out.append(cell[i])
            i += 1
    return "".join(out)


def test_tsv_to_a_file_or_a_pipe_is_lossless(tmp_path):
    """Off a terminal, tsv wrote the zero-width joiner, the right-to-left mark and the soft hyphen as
    literal \\u200d, \\u200f, \\xad (emoji and Hebrew captions broken), and a backslash as itself, so the
    text `a\\x1b` and a real ESC came out the same. Now only tab, line breaks and backslash are escaped."""
    with sf.TarWriter(str(tmp_path / "c.tar")) as w:
        w.write({"__key__": "c0", "txt": CAPTION.encode()})
    piped = run("tsv", tmp_path / "c.tar", "-f", "txt").stdout
    written = run("tsv", tmp_path / "c.tar", "-f", "txt", "-o", tmp_path / "c.tsv")
    assert written.exit_code == 0
    for text in (piped, (tmp_path / "c.tsv").read_text(encoding="utf-8")):
        header, row = text.split("\n")[:-1]  # only "\n" ends a line: a cell's line breaks are escaped
        assert header == "key\turl\ttxt"
        key, _, cell = row.split("\t")
        assert key == "c0" and _unescape_tsv(cell) == CAPTION


def test_show_writes_a_sheet_whose_size_and_tiles_match(shard, tmp_path):
    out = tmp_path / "sheet.png"
    result = run("show", shard, "-n", 5, "-o", out, "--columns", 3, "--size", 64)
    assert result.exit_code == 0, result.output
    image = Image.open(out).convert("RGB")
    assert image.size == sheet.sheet_size(5, 3, 64) == (3 * (64 + 8) + 8, 2 * (64 + 8 + sheet.TEXT_H) + 8)
    shown = [c for i, c in enumerate(COLORS) if i != 4][:5]  # sample 4 has no image
    for index, color in enumerate(shown):
        x, y = sheet.tile_origin(index, 3, 64)
        assert image.getpixel((x + 32, y + 64 - 15)) == color  # the 40x30 image, centred across, on the bottom
        assert image.getpixel((x + 32, y + 2)) == sheet.BACKGROUND  # the band above it
    x, y = sheet.tile_origin(5, 3, 64)  # the sixth slot is empty
    assert image.getpixel((x + 32, y + 32)) == sheet.BACKGROUND
    lines = result.stdout.splitlines()  # not a terminal: a text table
    assert lines[0].split("\t") == ["img/000", "png", "40x30", "0"]
    assert len(lines) == 5 and lines[4].startswith("img/005")


def test_show_inline_protocols():
    class Tty(io.BytesIO):
        def isatty(self):
            return True

    assert inline.inline_protocol(Tty(), {"TERM": "xterm-kitty"}) == "kitty"
    assert inline.inline_protocol(Tty(), {"TERM_PROGRAM": "iTerm.app"}) == "iterm"
    assert inline.inline_protocol(Tty(), {"TERM": "xterm-256color"}, ask_sixel=lambda: False) is None
    assert inline.inline_protocol(Tty(), {"TERM": "xterm-256color"}, ask_sixel=lambda: True) == "sixel"
    assert inline.inline_protocol(Tty(), {"TERM": "dumb"}, ask_sixel=lambda: True) is None
    assert inline.inline_protocol(io.BytesIO(), {"TERM": "xterm-kitty"}) is None  # not a terminal
    assert inline.inline_protocol(io.BytesIO(), {"SHARDFLOW_INLINE": "sixel"}) == "sixel"  # asked for
    assert inline.inline_protocol(Tty(), {"TERM": "xterm-kitty", "SHARDFLOW_INLINE": "none"}) is None
    noise = Image.frombytes("RGB", (400, 300), np.random.default_rng(0).bytes(360_000))  # several kitty chunks
    data = sheet.png_bytes(noise)
    kitty = inline.inline_image(noise, "kitty")
    assert kitty.startswith(b"\x1b_Ga=T,f=100,m=1;") and kitty.rstrip().endswith(b"\x1b\\")
    assert inline.inline_image(noise, "iterm").startswith(b"\x1b]1337;File=inline=1;size=%d" % len(data))
    six = inline.inline_image(noise, "sixel")
    assert six.startswith(b'\x1bPq"1;1;400;300') and six.rstrip().endswith(b"\x1b\\")


def test_show_without_images_fails_cleanly(tmp_path):
    with sf.TarWriter(str(tmp_path / "t.tar")) as w:
        w.write({"__key__": "a", "txt": b"x"})
    result = run("show", tmp_path / "t.tar", "-o", tmp_path / "s.png")
    assert result.exit_code == 1 and "no sample with an image" in result.output
    assert not (tmp_path / "s.png").exists()
