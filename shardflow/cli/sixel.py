"""Sixel output for `shardflow show`: terminals that speak neither kitty's nor iTerm2's image protocol
but DEC sixel graphics (xterm -ti vt340, foot, mlterm, mintty, Windows Terminal, contour, ...).

A sixel image is a palette of at most 256 colours, then bands six pixel rows high: per colour, one
character per column whose six bits say which of the band's rows have that colour. Whether a terminal
shows sixels is asked of the terminal itself (its primary device attributes list feature 4), because
no environment variable says so reliably (xterm has it only when built and started for it).
"""

from __future__ import annotations

import os
import re
import select
import termios
import time
from typing import Any

import numpy as np

_RUN = re.compile(rb"(.)\1{3,}")  # four or more equal characters: shorter as "!<count><char>"
_DA1 = b"\x1b[c"  # "primary device attributes?": the answer is ESC [ ? <n> ; <features> c
_ANSWER = re.compile(rb"\x1b\[\?([0-9;]*)c")


def encode_sixel(image: Any, colors: int = 256) -> bytes:
    """The DCS sequence that draws `image` (a PIL image) in at most `colors` palette colours."""
    rgb = image.convert("RGB")
    indexed = rgb.quantize(colors=colors)
    palette = indexed.getpalette()[: 3 * colors]
    pixels = np.asarray(indexed, dtype=np.int16)
    height, width = pixels.shape
    rows = -height % 6
    if rows:  # pad to whole bands with a colour no register has
        pixels = np.vstack([pixels, np.full((rows, width), -1, np.int16)])
    used = np.unique(pixels[pixels >= 0])
    out = [b'\x1bPq"1;1;%d;%d' % (width, height)]
    for index in used.tolist():  # colour registers, RGB in percent
        r, g, b = (round(v * 100 / 255) for v in palette[3 * index : 3 * index + 3])
        out.append(b"#%d;2;%d;%d;%d" % (index, r, g, b))
    columns = np.arange(width)
    row_bits = np.repeat(1 << np.arange(6), width).reshape(6, width)
    for top in range(0, pixels.shape[0], 6):
        band = pixels[top : top + 6].astype(np.int64)
        drawn = band >= 0
        # bits[colour, column]: the band's rows of that colour in that column (one bincount per band)
        bits = np.bincount((band * width + columns)[drawn], row_bits[drawn], minlength=256 * width)
        bits = bits.reshape(256, width).astype(np.uint8)
        lines = []
        for index in np.flatnonzero(bits.any(axis=1)).tolist():
            line = _RUN.sub(lambda m: b"!%d%c" % (len(m.group(0)), m.group(1)[0]), (bits[index] + 63).tobytes())
            lines.append(b"#%d%s" % (index, line))
        out.append(b"$".join(lines) + b"-")
    out.append(b"\x1b\\")
    return b"".join(out)


def terminal_has_sixel(fd: int, timeout: float = 0.3) -> bool:
    """Ask the terminal on `fd` (a tty, read and written) for its device attributes: True when they
    list sixel graphics (4). No answer within `timeout` (not a terminal that answers) is False."""
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        return False
    raw = list(saved)
    raw[3] &= ~(termios.ICANON | termios.ECHO)  # read the answer as it comes, and do not show it
    try:
        termios.tcsetattr(fd, termios.TCSANOW, raw)
        os.write(fd, _DA1)
        return _feature_4(_read_answer(fd, timeout))
    except OSError:
        return False
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _read_answer(fd: int, timeout: float) -> bytes:
    answer, deadline = b"", time.monotonic() + timeout
    while not _ANSWER.search(answer) and len(answer) < 256:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        answer += os.read(fd, 64)
    return answer


def _feature_4(answer: bytes) -> bool:
    found = _ANSWER.search(answer)
    return bool(found) and b"4" in found.group(1).split(b";")[1:]
