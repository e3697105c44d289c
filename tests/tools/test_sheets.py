"""Contact sheets (issue 29 item 17), run as a user runs them (a subprocess): `preview --sheet` shows the
keys and labels as `show` does, and a caption sits right under its image whatever the image's shape."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

from PIL import Image

import shardflow as sf
from shardflow.tools import sheet

SIZE = 96


def shardflow(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardflow.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def landscape_shard(path: Path, count: int = 3) -> None:
    with sf.TarWriter(str(path)) as w:
        for i in range(count):
            out = io.BytesIO()
            Image.new("RGB", (90, 40), (200, 40 * i, 60)).save(out, format="PNG")
            w.write({"__key__": f"k{i}", "png": out.getvalue(), "cls": b"%d" % i})


def caption_rows(image: Image.Image, index: int, columns: int, size: int) -> tuple[int, list[int]]:
    """The last row of tile `index`'s image and the rows below it that hold caption text."""
    x, y = sheet.tile_origin(index, columns, size)
    column = [image.getpixel((x + size // 2, row)) for row in range(y, y + size)]
    bottom = y + max(i for i, pixel in enumerate(column) if pixel != sheet.BACKGROUND)
    text = [row for row in range(bottom + 1, y + size + sheet.TEXT_H)
            if any(image.getpixel((col, row)) != sheet.BACKGROUND for col in range(x, x + size))]
    return bottom, text


def test_show_puts_each_caption_right_under_its_image(tmp_path):
    landscape_shard(tmp_path / "in.tar")
    done = shardflow("show", "in.tar", "-o", "show.png", "--size", SIZE, "--columns", 3, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    image = Image.open(tmp_path / "show.png").convert("RGB")
    for index in range(3):
        bottom, text = caption_rows(image, index, 3, SIZE)
        assert text and text[0] - bottom <= 6  # was 30 px below: the image was centred in its square


def test_preview_sheet_shows_keys_and_labels_like_show(tmp_path):
    landscape_shard(tmp_path / "in.tar")
    (tmp_path / "flip.py").write_text(textwrap.dedent('''
        """Flips images."""
        DECODE = "pil"

        def process(sample):
            return {"__key__": sample["__key__"], "png": sample["png"].transpose(0), "cls": int(sample["cls"])}
    '''))
    done = shardflow("preview", "flip.py", "-i", "in.tar", "-n", 3, "--sheet", "preview.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    image = Image.open(tmp_path / "preview.png").convert("RGB")
    assert image.size == sheet.sheet_size(3, 6, 160)
    for index in range(3):
        bottom, text = caption_rows(image, index, 6, 160)
        assert len(text) >= 12 and text[0] - bottom <= 6  # two lines: the key, then the label
