"""Showing a contact sheet inline on terminals that can (kitty graphics protocol, iTerm2/WezTerm inline
images, DEC sixel graphics: cli.sixel). The sheet itself (layout, tiles, keys and labels) is drawn by
tools.sheet, for `show` and `preview --sheet` alike.
"""

from __future__ import annotations

import base64
import os
from typing import Any, BinaryIO, Callable

from shardflow.cli.sixel import encode_sixel, terminal_has_sixel
from shardflow.tools.sheet import png_bytes

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
