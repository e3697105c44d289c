"""Sixel output of `shardflow show`: what the encoder writes draws the image's pixels (checked by a
decoder written here from the DEC format), and the terminal is asked over a real pty."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardflow.cli.sixel import encode_sixel, terminal_has_sixel


def decode_sixel(data: bytes) -> np.ndarray:
    """(H, W, 3) colours in percent from a sixel sequence with raster attributes."""
    assert data.startswith(b"\x1bPq") and data.endswith(b"\x1b\\")
    body = data[3:-2]
    raster = re.match(rb'"1;1;(\d+);(\d+)', body)
    width, height = int(raster.group(1)), int(raster.group(2))
    out = np.full((height + 6, width, 3), -1, np.int64)
    registers: dict[int, tuple[int, int, int]] = {}
    colour, x, top = None, 0, 0
    pos = raster.end()
    while pos < len(body):
        define = re.compile(rb"#(\d+);2;(\d+);(\d+);(\d+)").match(body, pos)
        select = re.compile(rb"#(\d+)").match(body, pos)
        repeat = re.compile(rb"!(\d+)(.)", re.S).match(body, pos)
        if define:
            registers[int(define.group(1))] = tuple(int(define.group(i)) for i in (2, 3, 4))
            pos = define.end()
        elif select:
            colour, pos = int(select.group(1)), select.end()
        elif repeat:
            count, char = int(repeat.group(1)), repeat.group(2)[0]
            for _ in range(count):
                x = _draw(out, registers[colour], x, top, char)
            pos = repeat.end()
        elif body[pos : pos + 1] == b"$":
            x, pos = 0, pos + 1
        elif body[pos : pos + 1] == b"-":
            x, top, pos = 0, top + 6, pos + 1
        else:
            x, pos = _draw(out, registers[colour], x, top, body[pos]), pos + 1
    return out[:height]


def _draw(out: np.ndarray, rgb: tuple[int, int, int], x: int, top: int, char: int) -> int:
    bits = char - 63
    assert 0 <= bits < 64
    for row in range(6):
        if bits >> row & 1:
            assert (out[top + row, x] == -1).all(), "a pixel drawn twice"
            out[top + row, x] = rgb
    return x + 1


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 40), height=st.integers(1, 20), colours=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_sixel_draws_every_pixel_in_its_colour(width, height, colours, seed):
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (colours, 3), dtype=np.uint8)
    pixels = palette[rng.integers(0, colours, (height, width))]
    if seed % 3 == 0:  # long runs of one colour: the "!count" form
        pixels[:] = pixels[:, :1]
    drawn = decode_sixel(encode_sixel(Image.fromarray(pixels, "RGB")))
    assert (drawn == np.rint(pixels.astype(np.float64) * 100 / 255).astype(np.int64)).all()


def test_a_photo_keeps_its_size_and_stays_close_in_256_colours():
    y, x = np.mgrid[0:61, 0:97]
    pixels = np.stack([x * 2, y * 4, (x + y) % 256], axis=-1).astype(np.uint8)
    data = encode_sixel(Image.fromarray(pixels, "RGB"))
    drawn = decode_sixel(data)
    assert drawn.shape == (61, 97, 3) and (drawn >= 0).all()
    assert np.abs(drawn - pixels.astype(np.float64) * 100 / 255).mean() < 3  # percent


def _terminal(answer: bytes | None) -> bool:
    """terminal_has_sixel over a real pty whose other end answers the DA1 query with `answer`."""
    controller, terminal = os.openpty()
    asked = []

    def respond() -> None:
        query = b""
        while not query.endswith(b"\x1b[c"):
            query += os.read(controller, 16)
        asked.append(query)
        if answer is not None:
            os.write(controller, answer)

    thread = threading.Thread(target=respond, daemon=True)
    thread.start()
    try:
        return terminal_has_sixel(terminal, timeout=0.5)
    finally:
        thread.join(2)
        assert asked == [b"\x1b[c"]
        os.close(terminal)
        os.close(controller)


def test_the_terminal_is_asked_for_its_device_attributes():
    assert _terminal(b"\x1b[?62;4;22c") is True  # xterm -ti vt340, foot, mlterm: feature 4
    assert _terminal(b"\x1b[?64;1;2;6;9;15;18;21;22c") is False  # a VT420 without sixel
    assert _terminal(b"\x1b[?1;2c") is False
    assert _terminal(None) is False  # no answer: not a terminal that speaks DA1


def test_not_a_terminal_is_no_sixel(tmp_path):
    with open(tmp_path / "f", "w+b") as f:
        assert terminal_has_sixel(f.fileno()) is False
