"""The contact sheet of `shardflow show`: tiles of images with their keys and labels (PIL), and
showing it inline on terminals that can (kitty graphics protocol, iTerm2/WezTerm inline images, DEC
sixel graphics: cli.sixel).

Layout (tests rely on it): `columns` tiles per row, each `PAD + size` wide and `PAD + size + TEXT_H`
high, plus PAD at the right and bottom; a tile's image is thumbnailed to fit `size` x `size` and
centred in its square; key and label are drawn below it, escaped and clipped.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

from shardflow.cli.sixel import encode_sixel, terminal_has_sixel
from shardflow.cli.tools_common import printable
from shardflow.codecs import IMAGE_EXTENSIONS

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
    data: bytes
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
            with Image.open(io.BytesIO(tile.data)) as img:
                tile.width, tile.height = img.size
                thumb = img.convert("RGB")
                thumb.thumbnail((size, size))
            sheet.paste(thumb, (x + (size - thumb.width) // 2, y + (size - thumb.height) // 2))
        except Exception as exc:  # noqa: BLE001 - a bad image is shown as such, the sheet goes on
            draw.line((x, y, x + size, y + size), fill=TEXT)
            draw.line((x, y + size, x + size, y), fill=TEXT)
            tile.label = f"cannot decode: {type(exc).__name__}"
        draw.text((x, y + size + 2), _clip(printable(tile.key), size, draw, font), fill=TEXT, font=font)
        draw.text((x, y + size + 13), _clip(printable(tile.label), size, draw, font), fill=TEXT, font=font)
    return sheet


def _clip(text: str, width: int, draw: Any, font: Any) -> str:
    while text and draw.textlength(text, font=font) > width:
        text = text[:-2] + "…" if len(text) > 2 else ""
    return text


def png_bytes(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


PROTOCOLS = ("kitty", "iterm", "sixel")


def inline_protocol(stream: BinaryIO | Any, environ: dict[str, str] | None = None,
                    ask_sixel: Callable[[], bool] | None = None) -> str | None:
    """'kitty', 'iterm' or 'sixel' when `stream` is a terminal that shows images inline, else None.

    kitty and iTerm2/WezTerm say who they are in the environment; sixel support is asked of the
    terminal (`ask_sixel`, default: its device attributes on /dev/tty). SHARDFLOW_INLINE=kitty|iterm|
    sixel|none decides instead, also when `stream` is not a terminal (to keep the sequence in a file)."""
    env = os.environ if environ is None else environ
    forced = env.get("SHARDFLOW_INLINE", "").lower()
    if forced:
        return forced if forced in PROTOCOLS else None
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return None
    if env.get("TERM") == "xterm-kitty" or env.get("KITTY_WINDOW_ID") or env.get("TERM_PROGRAM") == "ghostty":
        return "kitty"
    if env.get("TERM_PROGRAM") in ("iTerm.app", "WezTerm") or env.get("LC_TERMINAL") == "iTerm2":
        return "iterm"
    if env.get("TERM", "dumb") == "dumb":
        return None
    return "sixel" if (ask_sixel or _controlling_terminal_has_sixel)() else None


def _controlling_terminal_has_sixel() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return terminal_has_sixel(fd)
    finally:
        os.close(fd)


def inline_image(image: Any, protocol: str) -> bytes:
    """The escape sequence that shows `image` (a PIL image) inline (kitty: chunks of 4096 base64
    bytes of its PNG; sixel: at most 256 colours)."""
    if protocol == "sixel":
        return encode_sixel(image) + b"\n"
    png = png_bytes(image)
    data = base64.standard_b64encode(png)
    if protocol == "iterm":
        return b"\x1b]1337;File=inline=1;size=%d;preserveAspectRatio=1:" % len(png) + data + b"\x07\n"
    out = []
    for start in range(0, len(data), 4096):
        chunk = data[start : start + 4096]
        more = 1 if start + 4096 < len(data) else 0
        head = b"a=T,f=100,m=%d" % more if start == 0 else b"m=%d" % more
        out.append(b"\x1b_G" + head + b";" + chunk + b"\x1b\\")
    return b"".join(out) + b"\n"
