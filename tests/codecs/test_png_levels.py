"""shardflow's PNG writer at levels 2-9 (codecs.png): Pillow's bytes, made without Pillow's encoder
(Pillow's filter on every row, Pillow's deflate settings, Pillow's IDAT chunks), and the exact pixels."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardflow.codecs import Encoder, encode_value
from shardflow.codecs import deflate as deflate_mod
from shardflow.codecs.png import adaptive_rows, encode_png

CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


def _pixels(mode: str, height: int, width: int, seed: int, kind: str) -> np.ndarray:
    """Noise, a flat colour, a smooth gradient (Paeth's and Sub's rows), repeated rows (Up's), or a mix."""
    rng = np.random.default_rng(seed)
    shape = (height, width) if mode == "L" else (height, width, CHANNELS[mode])
    extra = [1] if mode != "L" else []
    if kind == "noise":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if kind == "flat":
        return np.full(shape, rng.integers(0, 256), np.uint8)
    if kind == "stripes":
        row = rng.integers(0, 256, (1, *shape[1:]), dtype=np.uint8)
        return np.repeat(row, height, axis=0)
    ramp = np.add.outer(np.arange(height) * rng.integers(1, 5), np.arange(width) * rng.integers(1, 5))
    ramp = np.broadcast_to(ramp.reshape(height, width, *extra), shape)
    return ((ramp + (rng.integers(0, 4, shape) if kind == "mix" else 0)) % 256).astype(np.uint8)


def _pillow_png(src: np.ndarray, level: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(src).save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def _filtered_rows(png: bytes) -> bytes:
    """The decompressed IDAT data of a PNG: its filter bytes and filtered rows."""
    pos, data = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        if png[pos + 4:pos + 8] == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(data)


def _pillow_deflates_like_cpython() -> bool:
    """Whether Pillow's encoder and CPython's zlib module deflate with the same library here (both link
    the system's libz in this project's install); where they do not, the files differ in their zlib
    stream only, and the filtered rows are still compared."""
    src = _pixels("RGB", 40, 50, 9, "mix")
    rows = _filtered_rows(_pillow_png(src, 6))
    pos, data = 8, b""
    png = _pillow_png(src, 6)
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        if png[pos + 4:pos + 8] == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return deflate_mod.deflate_like_pillow(rows, 6) == data


SAME_ZLIB = _pillow_deflates_like_cpython()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(sorted(CHANNELS)), height=st.integers(1, 70), width=st.integers(1, 45),
       seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["noise", "flat", "gradient", "stripes", "mix"]),
       level=st.integers(2, 9))
def test_pillows_bytes_at_levels_2_to_9_and_the_exact_pixels(mode, height, width, seed, kind, level):
    src = _pixels(mode, height, width, seed, kind)
    data = encode_value("png", src, png_compress_level=level)
    assert data == encode_png(Image.fromarray(src), level)  # written by shardflow's writer, not Pillow's
    pillow = _pillow_png(src, level)
    assert _filtered_rows(data) == _filtered_rows(pillow)  # the same filter on every row
    if SAME_ZLIB:
        assert data == pillow
    decoded = Image.open(io.BytesIO(data))
    decoded.load()
    assert decoded.mode == mode
    np.testing.assert_array_equal(np.asarray(decoded), src)


def test_a_large_image_is_cut_into_pillows_idat_chunks():
    src = _pixels("RGBA", 300, 500, 3, "noise")  # ~600 KB of zlib stream: ten 64 KiB chunks
    data, pillow = encode_value("png", src, png_compress_level=6), _pillow_png(src, 6)
    assert data.count(b"IDAT") == pillow.count(b"IDAT") > 5
    if SAME_ZLIB:
        assert data == pillow


def test_rows_in_more_than_one_band_are_filtered_against_the_row_above():
    """Bands of up to 32 rows (fewer on wide images): the first row of a band is Up/Paeth-filtered
    against the last row of the band before."""
    src = _pixels("RGB", 97, 33, 4, "gradient")
    rows = src.reshape(97, -1)
    expected = _filtered_rows(_pillow_png(src, 6))
    assert adaptive_rows(rows, 3).tobytes() == expected
    # and again with the same thread's arrays, now holding another image's rows
    other = _pixels("RGB", 97, 33, 5, "noise").reshape(97, -1)
    adaptive_rows(other, 3)
    assert adaptive_rows(rows, 3).tobytes() == expected
    wide = _pixels("L", 7, 100_000, 6, "mix")  # bands of 2 rows at this width: 4 bands
    assert adaptive_rows(wide, 1).tobytes() == _filtered_rows(_pillow_png(wide, 6))


def test_an_image_whose_png_carries_more_than_pixels_goes_to_pillow():
    """A PIL image with an ICC profile or a transparency colour: Pillow writes iCCP / tRNS from its info,
    which this writer would drop, so Pillow writes it (at every level)."""
    src = _pixels("RGB", 12, 10, 2, "mix")
    for info in ({"icc_profile": b"fake-icc-profile-bytes"}, {"transparency": (1, 2, 3)}):
        img = Image.fromarray(src)
        img.info.update(info)
        assert encode_png(img, 6) is None and encode_png(img, 1) is None
        for level in (1, 6):
            data = Encoder(png_compress_level=level)({"png": img})["png"]
            assert (b"iCCP" if "icc_profile" in info else b"tRNS") in data
