"""A contact sheet: tiles of images with their keys and labels (PIL), for `shardflow show` (tiles of
shard members) and `shardflow preview --sheet` (tiles of what process() returned): one layout, so both
show the key and the label under each image.

Layout (tests rely on it): `columns` tiles per row, each `PAD + size` wide and `PAD + size + TEXT_H`
high, plus PAD at the right and bottom; a tile's image is thumbnailed to fit `size` x `size`, centred
across and set on the bottom of its square, so the key and label drawn below it sit right under the
image whatever its shape (a centred landscape thumbnail left a band of up to size/4 between them).
Text is escaped and clipped.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from shardflow.codecs import IMAGE_EXTENSIONS
from shardflow.text import safe

PAD = 8
TEXT_H = 26  # two lines of the default font
BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)


@dataclass
class Tile:
    """One sample on the sheet: key, label text, the member shown and its decoded size."""

    key: str
    label: str
    ext: str
    data: Any  # the member's bytes, or an image already decoded (PIL)
    width: int = 0
    height: int = 0


def image_member(sample: dict[str, Any], wanted: str | None) -> str | None:
    """The extension of the member to show: `wanted`, else the first image member (name order)."""
    if wanted:
        return wanted if wanted in sample else None
    for ext in sorted(e for e in sample if not e.startswith("__")):
        if ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
            return ext
    return None


def sheet_size(count: int, columns: int, size: int) -> tuple[int, int]:
    """(width, height) of a sheet of `count` tiles."""
    cols = max(1, min(columns, count))
    rows = max(1, -(-count // cols))
    return cols * (PAD + size) + PAD, rows * (PAD + size + TEXT_H) + PAD


def tile_origin(index: int, columns: int, size: int) -> tuple[int, int]:
    """Top-left corner of tile `index`'s image square."""
    row, col = divmod(index, columns)
    return PAD + col * (PAD + size), PAD + row * (PAD + size + TEXT_H)


def render(tiles: list[Tile], columns: int, size: int) -> Any:
    """The sheet as a PIL image (tiles whose image cannot be decoded show a cross and the reason)."""
    from PIL import Image, ImageDraw, ImageFont

    cols = max(1, min(columns, len(tiles)))
    sheet = Image.new("RGB", sheet_size(len(tiles), cols, size), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for index, tile in enumerate(tiles):
        x, y = tile_origin(index, cols, size)
        try:
            thumb = _thumbnail(tile, size)
            sheet.paste(thumb, (x + (size - thumb.width) // 2, y + size - thumb.height))
        except Exception as exc:  # noqa: BLE001 - a bad image is shown as such, the sheet goes on
            draw.line((x, y, x + size, y + size), fill=TEXT)
            draw.line((x, y + size, x + size, y), fill=TEXT)
            tile.label = f"cannot decode: {type(exc).__name__}"
        draw.text((x, y + size + 2), _clip(safe(tile.key), size, draw, font), fill=TEXT, font=font)
        draw.text((x, y + size + 13), _clip(safe(tile.label), size, draw, font), fill=TEXT, font=font)
    return sheet


def _thumbnail(tile: Tile, size: int) -> Any:
    """The tile's image as RGB within size x size (its full size noted on the tile)."""
    from PIL import Image

    if isinstance(tile.data, (bytes, bytearray, memoryview)):
        with Image.open(io.BytesIO(tile.data)) as img:
            tile.width, tile.height = img.size
            thumb = img.convert("RGB")
    else:
        tile.width, tile.height = tile.data.size
        thumb = tile.data.convert("RGB")
    thumb.thumbnail((size, size))
    return thumb


def _clip(text: str, width: int, draw: Any, font: Any) -> str:
    while text and draw.textlength(text, font=font) > width:
        text = text[:-2] + "…" if len(text) > 2 else ""
    return text


def png_bytes(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()
