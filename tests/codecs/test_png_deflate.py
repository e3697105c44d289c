"""The fast PNG writer and its deflate engines (codecs.deflate): exact pixels, the same bytes on every
run and in every process, and a missing engine is an error, never a quiet switch to another one."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardflow.codecs import Encoder, ImageOptions, encode_value
from shardflow.codecs import deflate as deflate_mod
from shardflow.codecs.png import encode_png
from shardflow.errors import EncodeError

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


def _pixels(mode: str, height: int, width: int, seed: int, kind: str) -> np.ndarray:
    """Noise, flat colour, or a noisy gradient (long matches and short ones) of the given mode."""
    rng = np.random.default_rng(seed)
    shape = (height, width) if mode == "L" else (height, width, CHANNELS[mode])
    if kind == "noise":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if kind == "flat":
        return np.full(shape, rng.integers(0, 256), np.uint8)
    ramp = np.add.outer(np.arange(height), np.arange(width)).astype(np.int64)
    ramp = ramp.reshape(height, width, *([1] if mode != "L" else [])) + rng.integers(0, 8, shape)
    return (ramp % 256).astype(np.uint8)


def _decoded(data: bytes) -> tuple[str, np.ndarray]:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.mode, np.asarray(img)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(sorted(CHANNELS)), height=st.integers(1, 37), width=st.integers(1, 41),
       seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["noise", "flat", "gradient"]),
       engine=st.sampled_from(["isal", "zlib"]), level=st.sampled_from([0, 1]))
def test_fast_png_decodes_to_the_exact_pixels(mode, height, width, seed, kind, engine, level):
    src = _pixels(mode, height, width, seed, kind)
    data = encode_value("png", src, png_compress_level=level, png_deflate=engine)
    assert data == encode_png(Image.fromarray(src), level, engine)  # the fast writer wrote it
    got_mode, got = _decoded(data)
    assert got_mode == mode
    np.testing.assert_array_equal(got, src)


def test_zlib_engine_writes_the_bytes_of_before():
    """png_deflate="zlib" is byte for byte what the writer made before the option: Up filter + zlib."""
    src = _pixels("RGB", 23, 17, 5, "gradient")
    flat = src.reshape(23, -1).astype(np.int16)
    rows = np.concatenate([flat[:1], flat[1:] - flat[:-1]]) % 256
    raw = np.hstack([np.full((23, 1), 2), rows]).astype(np.uint8).tobytes()

    def chunk(tag: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + tag + body + zlib.crc32(tag + body).to_bytes(4, "big")

    header = (17).to_bytes(4, "big") + (23).to_bytes(4, "big") + bytes((8, 2, 0, 0, 0))
    expected = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1))
                + chunk(b"IEND", b""))
    assert encode_value("png", src, png_deflate="zlib") == expected
    assert encode_value("png", src) != expected  # the default engine is isal: other (valid) bytes


def test_isal_is_the_default_and_no_larger_than_zlib_on_noisy_photos():
    assert Encoder().options.png_deflate == "isal" and ImageOptions().png_deflate == "isal"
    photo = _pixels("RGB", 96, 128, 1, "gradient") // 2 + _pixels("RGB", 96, 128, 2, "noise") // 8
    assert len(encode_value("png", photo)) <= len(encode_value("png", photo, png_deflate="zlib"))


_DIGEST_SCRIPT = """
import hashlib, numpy as np
from shardflow.codecs import encode_value
rng = np.random.default_rng(7)
img = (np.add.outer(np.arange(64), np.arange(48))[..., None] + rng.integers(0, 16, (64, 48, 3))) % 256
print(hashlib.sha256(encode_value("png", img.astype(np.uint8))).hexdigest())
"""


@pytest.mark.slow
def test_same_bytes_on_every_run_and_in_every_process():
    here: list[str] = []
    exec(_DIGEST_SCRIPT, {"print": here.append})  # the same script in this process
    runs = [subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True, check=True,
                           cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout.strip()
            for _ in range(2)]
    assert runs[0] == runs[1] == here[0]
    import isal

    if isal.__version__ == "1.9.1":  # the pinned version (constraints.txt): its bytes are the format
        assert runs[0] == "3f131ba0dcf502c57c9280146ba382e29a586d2a85aaabaf8eab323810dbb327", (
            "isal wrote other PNG bytes than the pinned version does: the output of every job writing PNG "
            "changes (a format change: say so), or this CPU takes another ISA-L code path")


def test_encoder_pickles_keep_their_engine_and_old_ones_keep_zlib():
    for engine in ("isal", "zlib"):
        assert pickle.loads(pickle.dumps(Encoder(png_deflate=engine))).options.png_deflate == engine
    old_state = {"jpeg_quality": 90, "png_compress_level": 1, "webp_quality": 90}  # pickled before the option
    options = ImageOptions.__new__(ImageOptions)
    options.__setstate__(old_state)
    assert options == ImageOptions(png_deflate="zlib")
    with pytest.raises(ValueError, match="png_deflate must be one of 'isal', 'zlib'"):
        Encoder(png_deflate="zlib-ng")


@pytest.fixture
def without_isal(monkeypatch):
    """`import isal` fails, as where the package is not installed; the engine cache is reset around it."""
    deflate_mod._isal_compress.cache_clear()
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)
    yield
    deflate_mod._isal_compress.cache_clear()


def test_missing_isal_is_a_clear_error_not_a_fallback(without_isal):
    with pytest.raises(deflate_mod.MissingDeflateEngine) as info:
        Encoder()  # checked when the options are made, on the driver
    message = str(info.value)
    assert "png_deflate='isal' needs the 'isal' package" in message and "png_deflate='zlib'" in message
    assert "pip install isal" in message
    # engines and levels that do not deflate through isal do not need it
    src = _pixels("RGB", 8, 8, 3, "noise")
    for options in ({"png_deflate": "zlib"}, {"png_compress_level": 0}, {"png_compress_level": 6}):
        np.testing.assert_array_equal(_decoded(Encoder(**options)({"png": src})["png"])[1], src)


def test_an_isal_encoder_on_a_worker_without_isal_fails_and_writes_nothing_else(monkeypatch):
    encoder = pickle.loads(pickle.dumps(Encoder()))  # made where isal is, unpickled where it is not
    deflate_mod._isal_compress.cache_clear()
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)
    try:
        with pytest.raises(EncodeError, match="png_deflate='isal' needs the 'isal' package"):
            encoder({"__key__": "k", "png": _pixels("L", 4, 4, 0, "noise")})
    finally:
        deflate_mod._isal_compress.cache_clear()


def _clip_round(arr: np.ndarray) -> np.ndarray:
    """The general float -> uint8 rule, written out: clip to [0, 1] (NaN -> 0), times 255, round half to even."""
    work = arr.astype(np.float32) if arr.dtype.itemsize < 4 else arr
    work = np.fmin(np.fmax(work, 0.0), 1.0) * work.dtype.type(255.0)
    return np.rint(work).astype(np.uint8)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from([np.float16, np.float32, np.float64]), shape=st.sampled_from([(3, 5, 7), (5, 7)]),
       seed=st.integers(0, 2**32 - 1), chw=st.booleans())
def test_float_pixels_in_range_take_the_short_path_to_the_same_bytes(dtype, shape, seed, chw):
    from shardflow.codecs.images import _float_to_uint8

    rng = np.random.default_rng(seed)
    halves = (rng.integers(0, 255, shape) + 0.5) / 255  # exactly between two grey levels, where rounding shows
    arr = np.where(rng.random(shape) < 0.5, rng.random(shape), halves).astype(dtype)
    arr.flat[0], arr.flat[-1] = 0.0, 1.0
    view = arr.transpose(1, 2, 0) if chw and arr.ndim == 3 else arr  # a CHW tensor's HWC view, as to_pil has
    got = _float_to_uint8(view)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, _clip_round(view))
