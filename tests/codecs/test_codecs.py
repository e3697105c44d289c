"""Tests for shardflow.codecs: real Pillow/numpy/msgpack/cbor2/simplejpeg/torch, no mocks."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile

import numpy as np
import pytest
from PIL import Image

from shardflow.codecs import (
    IMAGE_SPECS,
    Decoder,
    Encoder,
    decode_value,
    encode_value,
    register_codec,
    unregister_codec,
)
from shardflow.codecs import registry as codecs
from shardflow.errors import DecodeError, EncodeError, JobError

H, W = 32, 48  # not square, so HW/WH mix-ups show


def gradient(h: int = H, w: int = W) -> np.ndarray:
    """A smooth RGB image (JPEG-friendly) with distinct channels."""
    y, x = np.mgrid[0:h, 0:w]
    r = x * 255 // (w - 1)
    g = y * 255 // (h - 1)
    b = (x + y) * 255 // (h + w - 2)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def jpeg_bytes(arr: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def luma(arr: np.ndarray) -> np.ndarray:
    return np.array(Image.fromarray(arr).convert("L"))


def opaque(a: np.ndarray) -> np.ndarray:
    """The RGB source with a 255 alpha channel: what the rgba specs give for an RGB image."""
    return np.dstack([a, np.full(a.shape[:2], 255, np.uint8)])


@pytest.fixture
def clean_registry():
    before_d, before_e = dict(codecs._user_decoders), dict(codecs._user_encoders)
    yield
    codecs._user_decoders.clear()
    codecs._user_decoders.update(before_d)
    codecs._user_encoders.clear()
    codecs._user_encoders.update(before_e)


# ------------------------------------------------------------------------------------ image specs

NUMPY_SPECS = {
    # spec: (shape, dtype, expected from the RGB source)
    "numpy": ((H, W, 3), np.uint8, lambda a: a),
    "rgb8": ((H, W, 3), np.uint8, lambda a: a),
    "rgba8": ((H, W, 4), np.uint8, lambda a: opaque(a)),
    "l8": ((H, W), np.uint8, luma),
    "rgb": ((H, W, 3), np.float32, lambda a: a / 255.0),
    "rgba": ((H, W, 4), np.float32, lambda a: opaque(a) / 255.0),
    "l": ((H, W), np.float32, lambda a: luma(a) / 255.0),
}


@pytest.mark.parametrize("spec", sorted(NUMPY_SPECS))
def test_numpy_specs_decode_png_exactly(spec):
    src = gradient()
    shape, dtype, expect = NUMPY_SPECS[spec]
    out = decode_value("png", png_bytes(src), spec)
    assert isinstance(out, np.ndarray)
    assert out.shape == shape and out.dtype == dtype
    np.testing.assert_allclose(out, expect(src).astype(dtype), rtol=0, atol=1e-6)
    if dtype == np.float32:
        assert 0.0 <= out.min() and out.max() <= 1.0 and out.max() > 0.9
    out[0, 0] = 0  # decoded arrays are writable: users modify them in place


@pytest.mark.parametrize("spec,mode", [("pil", "RGB"), ("pilrgb", "RGB"), ("pilrgba", "RGBA"), ("pill", "L")])
def test_pil_specs(spec, mode):
    src = gradient()
    out = decode_value("png", png_bytes(src), spec)
    assert isinstance(out, Image.Image)
    assert out.mode == mode and out.size == (W, H)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(Image.fromarray(src).convert(mode)))


def test_every_spec_is_tested():
    torch_specs = {s for s in IMAGE_SPECS if s.startswith("torch")}
    pil_specs = {"pil", "pilrgb", "pilrgba", "pill"}
    assert set(IMAGE_SPECS) == set(NUMPY_SPECS) | pil_specs | torch_specs
    assert torch_specs == set(TORCH_SPECS)


def test_numpy_spec_keeps_stored_values():
    # palette image (segmentation mask): indices, not colours
    mask = (np.arange(H * W).reshape(H, W) % 5).astype(np.uint8)
    img = Image.fromarray(mask).convert("P")
    img.putpalette([i * 40 for i in range(5) for _ in range(3)])
    buf = io.BytesIO()
    img.save(buf, "PNG")
    out = decode_value("png", buf.getvalue(), "numpy")
    assert out.dtype == np.uint8 and out.shape == (H, W)
    np.testing.assert_array_equal(out, mask)
    # 16-bit depth map keeps 16 bits
    depth = (np.arange(H * W).reshape(H, W) * 37).astype(np.uint16)
    out = decode_value("png", encode_value("png", depth), "numpy")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, depth)


def test_unknown_spec_rejected():
    with pytest.raises(ValueError, match="unknown image spec"):
        Decoder("rgb16")


TORCH_SPECS = {
    # spec: (shape, dtype name, expected numpy from the RGB source)
    "torchrgb8": ((3, H, W), "uint8", lambda a: a.transpose(2, 0, 1)),
    "torchrgba8": ((4, H, W), "uint8", lambda a: opaque(a).transpose(2, 0, 1)),
    "torchl8": ((H, W), "uint8", luma),
    "torchrgb": ((3, H, W), "float32", lambda a: a.transpose(2, 0, 1) / 255.0),
    "torch": ((3, H, W), "float32", lambda a: a.transpose(2, 0, 1) / 255.0),
    "torchrgba": ((4, H, W), "float32", lambda a: opaque(a).transpose(2, 0, 1) / 255.0),
    "torchl": ((H, W), "float32", lambda a: luma(a) / 255.0),
}


@pytest.mark.parametrize("spec", sorted(TORCH_SPECS))
def test_torch_specs(spec):
    torch = pytest.importorskip("torch")
    src = gradient()
    shape, dtype, expect = TORCH_SPECS[spec]
    out = decode_value("png", png_bytes(src), spec)
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == shape and out.dtype == getattr(torch, dtype)
    assert out.is_contiguous()
    np.testing.assert_allclose(out.numpy(), expect(src).astype(dtype), rtol=0, atol=1e-6)


def test_torch_jpeg_uses_same_pixels_as_numpy():
    torch = pytest.importorskip("torch")
    data = jpeg_bytes(gradient())
    t = decode_value("jpg", data, "torchrgb8")
    a = decode_value("jpg", data, "rgb8")
    assert t.dtype == torch.uint8
    np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), a)


# ---------------------------------------------------------------------------------- image encoding

LOSSLESS = ["png", "ppm", "bmp", "tif", "tiff"]


@pytest.mark.parametrize("ext", LOSSLESS)
def test_lossless_image_round_trip(ext):
    src = gradient()
    out = decode_value(ext, encode_value(ext, src), "rgb8")
    np.testing.assert_array_equal(out, src)
    gray = luma(src)
    np.testing.assert_array_equal(decode_value(ext, encode_value(ext, gray), "l8"), gray)


def test_pgm_pbm_round_trip():
    gray = luma(gradient())
    np.testing.assert_array_equal(decode_value("pgm", encode_value("pgm", gray), "l8"), gray)
    binary = gray > 100
    out = decode_value("pbm", encode_value("pbm", binary), "numpy")
    np.testing.assert_array_equal(out.astype(bool), binary)
    assert encode_value("pgm", gray).startswith(b"P5") and encode_value("pbm", binary).startswith(b"P4")


@pytest.mark.parametrize("ext", ["jpg", "jpeg", "webp"])
def test_lossy_image_round_trip(ext):
    src = gradient(64, 96)
    out = decode_value(ext, encode_value(ext, src), "rgb8")
    assert out.shape == src.shape and out.dtype == np.uint8
    err = np.abs(out.astype(int) - src.astype(int))
    assert err.mean() < 2.0 and err.max() < 40


def test_quality_settings_change_output():
    src = gradient(64, 96)
    assert len(encode_value("jpg", src, jpeg_quality=30)) < len(encode_value("jpg", src, jpeg_quality=95))
    assert len(encode_value("webp", src, webp_quality=10)) < len(encode_value("webp", src, webp_quality=95))
    noisy = np.random.default_rng(0).integers(0, 40, (64, 96, 3), dtype=np.uint8) + src // 2
    assert len(encode_value("png", noisy, png_compress_level=9)) < len(encode_value("png", noisy))
    assert Encoder().options.png_compress_level == 1
    with pytest.raises(ValueError):
        Encoder(png_compress_level=10)


def test_float_arrays_are_scaled_and_rounded():
    # values just outside [0, 1] (rounding) are clipped; far outside is an EncodeError (test_output_safety)
    arr = np.array([[[-0.001, 0.0, 0.5], [1.0, 1.001, 0.2]], [[np.nan, 0.998, 0.002], [0.25, 0.75, 1.0]]])
    out = decode_value("png", encode_value("png", arr), "rgb8")
    expect = np.array([[[0, 0, 128], [255, 255, 51]], [[0, 254, 1], [64, 191, 255]]], np.uint8)
    np.testing.assert_array_equal(out, expect)
    # float32 [0,1] from the "rgb" spec goes back to the same uint8 exactly
    src = gradient()
    as_float = decode_value("png", png_bytes(src), "rgb")
    np.testing.assert_array_equal(decode_value("png", encode_value("png", as_float), "rgb8"), src)


def test_image_value_kinds():
    src = gradient()
    rgba = np.dstack([src, np.full((H, W), 7, np.uint8)])
    np.testing.assert_array_equal(decode_value("png", encode_value("png", rgba), "rgba8"), rgba)
    one_channel = encode_value("png", src[..., :1])
    np.testing.assert_array_equal(decode_value("png", one_channel, "numpy"), src[..., 0])
    np.testing.assert_array_equal(decode_value("png", encode_value("png", Image.fromarray(src)), "rgb8"), src)
    # jpeg has no alpha: RGBA is stored as RGB instead of failing
    assert decode_value("jpg", encode_value("jpg", rgba), "numpy").shape == (H, W, 3)
    # integer masks in 0..255 are accepted; anything else is refused with a reason
    mask = (np.arange(H * W).reshape(H, W) % 200).astype(np.int64)
    np.testing.assert_array_equal(decode_value("png", encode_value("png", mask), "numpy"), mask)
    with pytest.raises(EncodeError, match="0..255"):
        encode_value("png", mask + 300, key="k")
    with pytest.raises(EncodeError, match="HW or HWC"):
        encode_value("png", np.zeros((4, 4, 2), np.uint8))


def test_torch_tensors_encode_as_chw():
    torch = pytest.importorskip("torch")
    src = gradient()
    chw = torch.from_numpy(src).permute(2, 0, 1)
    np.testing.assert_array_equal(decode_value("png", encode_value("png", chw), "rgb8"), src)
    np.testing.assert_array_equal(decode_value("png", encode_value("png", chw.float() / 255), "rgb8"), src)
    bf16 = decode_value("png", encode_value("png", chw.to(torch.bfloat16) / 255), "rgb8")
    assert bf16.shape == src.shape and np.abs(bf16.astype(int) - src.astype(int)).max() <= 1
    gray = torch.from_numpy(luma(src))
    np.testing.assert_array_equal(decode_value("png", encode_value("png", gray), "l8"), luma(src))
    np.testing.assert_array_equal(decode_value("png", encode_value("png", gray[None]), "l8"), luma(src))
    # round trip through the torch specs
    t = decode_value("png", encode_value("png", decode_value("png", png_bytes(src), "torchrgb")), "torchrgb")
    np.testing.assert_array_equal(t.numpy(), src.transpose(2, 0, 1) / np.float32(255))


@pytest.mark.gpu
def test_cuda_tensors_are_moved_to_cpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    src = gradient()
    chw = torch.from_numpy(src).permute(2, 0, 1).cuda()
    np.testing.assert_array_equal(decode_value("png", encode_value("png", chw / 255.0), "rgb8"), src)
    np.testing.assert_array_equal(decode_value("npy", encode_value("npy", chw)), src.transpose(2, 0, 1))
    assert decode_value("json", encode_value("json", {"v": chw[0, 0, :2]})) == {"v": src[0, :2, 0].tolist()}
    assert decode_value("pth", encode_value("pth", chw)).device.type == "cpu"


# ------------------------------------------------------------------------------------- non-images

PLAIN_ROUND_TRIPS = [
    ("json", {"b": [1, 2.5, None, True], "a": "é"}),
    ("jsn", [1, {"x": "y"}]),
    ("txt", "héllo\nworld"),
    ("text", "plain"),
    ("cls", 7),
    ("cls2", 0),
    ("index", 123456789012),
    ("id", -3),
    ("inx", 42),
    ("msgpack", {"a": [1, 2], "b": b"\x00\xff", "c": "s"}),
    ("mp", [1, "two", 3.0]),
    ("cbor", {"a": [1, 2], "b": b"\x00\xff", "c": 1.5}),
]


@pytest.mark.parametrize("ext,value", PLAIN_ROUND_TRIPS, ids=[e for e, _ in PLAIN_ROUND_TRIPS])
def test_plain_round_trips(ext, value):
    data = encode_value(ext, value)
    assert isinstance(data, bytes)
    out = decode_value(ext, data)
    assert out == value and type(out) is type(value)


def test_cls_is_ascii_decimal_and_json_compact():
    assert encode_value("cls", 3) == b"3"
    assert encode_value("cls", np.int64(12)) == b"12"
    assert decode_value("cls", b" 5\n") == 5
    assert encode_value("json", {"b": 1, "a": [1, 2]}) == b'{"b":1,"a":[1,2]}'  # own order, compact
    assert encode_value("json", {"s": "é"}) == '{"s":"é"}'.encode("utf-8")
    numpyish = {"n": np.float32(0.5), "v": np.arange(3)}
    assert json.loads(encode_value("json", numpyish)) == {"n": 0.5, "v": [0, 1, 2]}
    # a str is taken as the file's text, for any extension (as webdataset does)
    assert encode_value("json", '{"already": "json"}') == b'{"already": "json"}'
    with pytest.raises(EncodeError, match="cls"):
        encode_value("cls", 2.5)


def test_npy_and_npz():
    arrs = {"a": np.arange(12, dtype=np.int16).reshape(3, 4), "b": np.linspace(0, 1, 5, dtype=np.float32)}
    out = decode_value("npy", encode_value("npy", arrs["a"]))
    np.testing.assert_array_equal(out, arrs["a"])
    assert out.dtype == np.int16 and out.flags.writeable
    out = decode_value("npz", encode_value("npz", arrs))
    assert isinstance(out, dict) and list(out) == ["a", "b"]
    for k in arrs:
        np.testing.assert_array_equal(out[k], arrs[k])
        assert out[k].dtype == arrs[k].dtype
    # np.load must read what we write, and what np.savez writes must decode
    np.testing.assert_array_equal(np.load(io.BytesIO(encode_value("npy", arrs["b"]))), arrs["b"])
    buf = io.BytesIO()
    np.savez(buf, **arrs)
    np.testing.assert_array_equal(decode_value("npz", buf.getvalue())["b"], arrs["b"])


def test_npz_and_gzip_carry_no_timestamp():
    npz = encode_value("npz", {"x": np.zeros(2)})
    with zipfile.ZipFile(io.BytesIO(npz)) as zf:
        assert [i.date_time for i in zf.infolist()] == [(1980, 1, 1, 0, 0, 0)]
    gz = encode_value("json.gz", {"a": 1})
    assert gz[:2] == b"\x1f\x8b" and gz[4:8] == b"\x00\x00\x00\x00"  # mtime field
    tiff = Image.open(io.BytesIO(encode_value("tiff", gradient())))
    assert 306 not in tiff.tag_v2  # no DateTime tag


def test_pth_round_trip_and_weights_only():
    torch = pytest.importorskip("torch")
    value = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": 3}
    data = encode_value("pth", value)
    assert data == encode_value("pth", value)  # deterministic
    out = decode_value("pth", data)
    assert torch.equal(out["w"], value["w"]) and out["n"] == 3
    # arbitrary objects need a full unpickle: refused by default
    evil = encode_value("pth", {"obj": Opaque(1)})
    with pytest.raises(DecodeError, match="pth"):
        decode_value("pth", evil)
    assert decode_value("pth", evil, allow_pickle=True)["obj"] == Opaque(1)


class Opaque:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


@pytest.mark.parametrize("ext", ["pyd", "pickle"])
def test_pickle_refused_unless_allowed(ext):
    data = encode_value(ext, Opaque(5))
    with pytest.raises(DecodeError, match="allow_pickle=True") as info:
        Decoder()({"__key__": "k", "__url__": "u", ext: data})
    assert ext in str(info.value)
    assert Decoder(allow_pickle=True)({"__key__": "k", ext: data})[ext] == Opaque(5)
    assert decode_value(ext, data, allow_pickle=True) == Opaque(5)


def test_object_npy_refused_unless_allowed():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="npy"):
        decode_value("npy", buf.getvalue())
    assert decode_value("npy", buf.getvalue(), allow_pickle=True)[0] == {"a": 1}


# -------------------------------------------------------------------------- gz and multi-part keys


@pytest.mark.parametrize(
    "ext,value",
    [("json.gz", {"a": [1, 2]}), ("txt.gz", "zipped"), ("cls.gz", 4), ("npy.gz", np.arange(5))],
)
def test_gz_suffix(ext, value):
    data = encode_value(ext, value)
    inner = gzip.decompress(data)
    assert inner == encode_value(ext[:-3], value)
    out = Decoder()({"__key__": "k", ext: data})
    assert list(out) == ["__key__", ext]  # the key stays "json.gz"
    if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(out[ext], value)
    else:
        assert out[ext] == value


def test_gz_image_and_plain_gz():
    src = gradient()
    np.testing.assert_array_equal(decode_value("seg.png.gz", encode_value("seg.png.gz", src), "rgb8"), src)
    assert decode_value("gz", gzip.compress(b"raw")) == b"raw"
    # bytes are final: a .gz key with bytes is written as given, not compressed again
    assert encode_value("json.gz", b"already-gz") == b"already-gz"
    with pytest.raises(DecodeError, match="json.gz"):
        decode_value("json.gz", b"not gzip", url="u", key="k")


def test_multi_part_extension_uses_last_part():
    src = gradient()
    mask = luma(src)
    sample = Encoder()({"__key__": "k", "seg.png": mask, "meta.json": {"a": 1}, "x.cls": 2})
    out = Decoder("numpy")(sample)
    np.testing.assert_array_equal(out["seg.png"], mask)
    assert out["meta.json"] == {"a": 1} and out["x.cls"] == 2


# ------------------------------------------------------------------------------- Decoder behaviour


def test_decoder_metadata_unknown_and_none():
    sample = {"__key__": "a/1", "__url__": "file:///s.tar", "__local__": b"x", "weird": b"\x00"}
    sample["json"] = b"[1]"
    out = Decoder()(sample)
    assert out["__key__"] == "a/1" and out["__url__"] == "file:///s.tar" and out["__local__"] == b"x"
    assert out["weird"] == b"\x00" and out["json"] == [1]
    assert Decoder(None)(sample) == sample
    assert decode_value("json", b"[1]", None) == b"[1]"
    already = {"__key__": "k", "json": {"a": 1}}
    assert Decoder()(already) == already  # decoded values pass through


def test_only_restricts_decoding():
    src = gradient()
    sample = {"__key__": "k", "jpg": jpeg_bytes(src), "json": b'{"a":1}', "cls": b"3"}
    sample["meta.json.gz"] = gzip.compress(b"[2]")
    out = Decoder("rgb8", only={"json"})(sample)
    assert out["jpg"] == sample["jpg"] and out["cls"] == b"3"
    assert out["json"] == {"a": 1} and out["meta.json.gz"] == [2]
    out = Decoder("rgb8", only="jpg cls")(sample)
    assert out["jpg"].shape == (H, W, 3) and out["cls"] == 3 and out["json"] == sample["json"]
    assert Decoder(only=["meta.json.gz"])(sample)["json"] == sample["json"]


def test_decode_errors_name_url_key_ext_and_chain():
    url, key = "file:///data/shard-000003.tar", "a/000017"
    cases = [
        ("jpg", b"\xff\xd8 definitely not a jpeg", "cannot identify image file"),
        ("json", b'{"a": ', "Expecting"),
        ("png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, ""),
        ("cls", b"x", "invalid literal"),
        ("txt", b"\xff\xfe\xfa", "utf-8"),
    ]
    for ext, data, reason in cases:
        for fast in (True, False):
            with pytest.raises(DecodeError) as info:
                Decoder("rgb8", fast_jpeg=fast)({"__key__": key, "__url__": url, ext: data})
            msg = str(info.value)
            assert url in msg and repr(key) in msg and repr(ext) in msg and reason in msg, msg
            assert info.value.url == url and info.value.key == key
            assert info.value.__cause__ is not None
            assert not re.search(r"at 0x[0-9a-fA-F]+", msg)  # same failure, same reason: stats count it


def test_decoder_pickles_with_its_codecs(clean_registry):
    register_codec("upper", decode=_upper_decode, encode=_upper_encode)
    dec, enc = Decoder(), Encoder()
    unregister_codec("upper")
    dec2, enc2 = pickle.loads(pickle.dumps(dec)), pickle.loads(pickle.dumps(enc))
    assert dec2({"__key__": "k", "upper": b"abc"})["upper"] == "ABC"
    assert enc2({"__key__": "k", "upper": "abc"})["upper"] == b"abc!"
    assert Decoder()({"__key__": "k", "upper": b"abc"})["upper"] == b"abc"  # gone for new ones


def _upper_decode(data: bytes) -> str:
    return data.decode().upper()


def _upper_encode(value: str) -> bytes:
    return value.encode() + b"!"


def test_register_codec_overrides_builtin(clean_registry):
    register_codec(".JSON", decode=lambda b: ("custom", b))
    assert Decoder()({"__key__": "k", "json": b"1"})["json"] == ("custom", b"1")
    assert Decoder()({"__key__": "k", "m.json.gz": gzip.compress(b"1")})["m.json.gz"] == ("custom", b"1")
    assert encode_value("json", {"a": 1}) == b'{"a":1}'  # encode side untouched
    register_codec("seg.png", decode=lambda b: "mask!", encode=lambda v: b"M" + bytes(v))
    assert decode_value("seg.png", b"xx") == "mask!"
    assert decode_value("png", png_bytes(gradient()), "rgb8").shape == (H, W, 3)  # only that key
    assert encode_value("seg.png", [1, 2]) == b"M\x01\x02"
    register_codec(
        "vec", encode=lambda v: np.asarray(v, "<f4").tobytes(), decode=lambda b: np.frombuffer(b, "<f4")
    )
    np.testing.assert_array_equal(decode_value("vec", encode_value("vec", [1.0, 2.0])), [1.0, 2.0])
    unregister_codec("json")
    assert decode_value("json", b"1") == 1
    with pytest.raises(ValueError):
        register_codec("x")
    register_codec("bad", encode=lambda v: "not bytes")
    with pytest.raises(EncodeError, match="not bytes"):
        encode_value("bad", 1)


def test_simplejpeg_matches_pillow():
    sj = pytest.importorskip("simplejpeg")
    src = gradient(120, 160)
    data = jpeg_bytes(src, 90)
    fast = decode_value("jpg", data, "rgb8", fast_jpeg=True)
    slow = decode_value("jpg", data, "rgb8", fast_jpeg=False)
    np.testing.assert_array_equal(fast, sj.decode_jpeg(data, colorspace="RGB"))  # the fast path ran
    assert fast.shape == slow.shape == src.shape and fast.dtype == slow.dtype == np.uint8
    assert np.abs(fast.astype(int) - slow.astype(int)).max() <= 2
    fast_f = decode_value("jpeg", data, "rgb", fast_jpeg=True)
    np.testing.assert_allclose(fast_f, fast / np.float32(255), atol=1e-7)
    # a PNG with a .jpg name and a grayscale/CMYK jpeg fall back to Pillow
    np.testing.assert_array_equal(decode_value("jpg", png_bytes(src), "rgb8"), src)
    buf = io.BytesIO()
    Image.fromarray(src).convert("CMYK").save(buf, "JPEG", quality=95)
    out = decode_value("jpg", buf.getvalue(), "rgb8")
    assert out.shape == src.shape and np.abs(out.astype(int) - src.astype(int)).mean() < 8


def test_decompression_bomb_limit_holds_on_both_jpeg_paths(monkeypatch):
    pytest.importorskip("simplejpeg")
    data = jpeg_bytes(gradient(120, 160))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # a real Pillow setting, not a mock
    for fast in (True, False):
        with pytest.raises(DecodeError, match="(?i)decompression bomb"):
            decode_value("jpg", data, "rgb8", fast_jpeg=fast)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 120 * 160)
    assert decode_value("jpg", data, "rgb8").shape == (120, 160, 3)
    # between 1x and 2x the limit Pillow only warns; simplejpeg does not: evidence of which path ran
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 120 * 160 - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        assert decode_value("jpg", data, "rgb8", fast_jpeg=True).shape == (120, 160, 3)
        assert decode_value("jpg", data, "rgb", fast_jpeg=True).shape == (120, 160, 3)
        with pytest.raises(DecodeError, match="(?i)decompression bomb"):
            decode_value("jpg", data, "rgb8", fast_jpeg=False)


# ------------------------------------------------------------------------------- Encoder behaviour


def full_sample():
    src = gradient()
    return {
        "__key__": "a/b/000001",
        "__url__": "file:///in.tar",
        "__local_path__": "/tmp/x",
        "jpg": src,
        "seg.png": luma(src),
        "webp": src,
        "tiff": src,
        "bmp": src,
        "ppm": src,
        "json": {"z": 1, "a": [1.5, None]},
        "json.gz": {"k": "v"},
        "txt": "text",
        "cls": 3,
        "npy": np.arange(6).reshape(2, 3),
        "npz": {"x": np.ones(3, np.float32)},
        "msgpack": {"m": 1},
        "cbor": [1, 2],
        "pyd": {"p": (1, 2)},
        "raw": b"\x00raw",
    }


def test_encoder_output_shape_and_determinism():
    a, b = Encoder()(full_sample()), Encoder()(full_sample())
    assert a == b  # byte-identical for identical input
    assert a["__key__"] == "a/b/000001"
    assert not any(k.startswith("__") and k != "__key__" for k in a)
    assert all(isinstance(v, bytes) for k, v in a.items() if k != "__key__")
    assert a["raw"] == b"\x00raw"
    decoded = Decoder("rgb8", allow_pickle=True)({**a, "__url__": "u"})
    assert decoded["json"] == {"z": 1, "a": [1.5, None]} and decoded["pyd"] == {"p": (1, 2)}
    assert decoded["cls"] == 3 and decoded["txt"] == "text" and decoded["json.gz"] == {"k": "v"}


@pytest.mark.slow
def test_determinism_across_processes():
    code = (
        "import hashlib, sys; sys.path.insert(0, '.'); import tests.codecs.test_codecs as t\n"
        "from shardflow.codecs import Encoder\n"
        "e = Encoder()(t.full_sample())\n"
        "print(hashlib.sha256(repr(sorted(e.items())).encode()).hexdigest())\n"
    )
    run = [sys.executable, "-c", code]
    runs = {subprocess.run(run, capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert len(runs) == 1 and len(runs.pop().strip()) == 64


def test_encode_errors_name_key_ext_and_type():
    with pytest.raises(EncodeError) as info:
        Encoder()({"__key__": "a/7", "__url__": "file:///in.tar", "weird": object()})
    msg = str(info.value)
    assert "'a/7'" in msg and "'weird'" in msg and "object" in msg and "file:///in.tar" in msg
    with pytest.raises(EncodeError, match="'txt'.*int"):
        Encoder()({"__key__": "k", "txt": 5})
    with pytest.raises(EncodeError, match="'msgpack'.*set"):
        Encoder()({"__key__": "k", "msgpack": {"a": {1, 2}}})
    with pytest.raises(EncodeError) as info:
        Encoder()({"__key__": "k", "png": {"a": 1}})
    assert info.value.__cause__ is not None and "'png'" in str(info.value)


# --------------------------------------------------------------------------------------- no torch


def test_import_and_use_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "import numpy as np\n"
        "from shardflow.codecs import Decoder, Encoder, decode_value, encode_value\n"
        "s = Encoder()({'__key__': 'k', 'png': np.zeros((4, 5, 3), np.uint8), 'json': {'a': 1}})\n"
        "assert Decoder('rgb')(s)['png'].shape == (4, 5, 3)\n"
        "try:\n    Decoder('torchrgb')\nexcept ImportError as e:\n    print('torch-needed:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "torch-needed: this needs torch" in r.stdout


def test_codecs_import_does_not_import_torch():
    code = (
        "import sys, numpy as np\nfrom shardflow.codecs import Decoder, Encoder\n"
        "s = Encoder()({'__key__': 'k', 'jpg': np.zeros((4, 5, 3), np.uint8)})\n"
        "Decoder('rgb8')(s)\nprint('torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


# ------------------------------------------------------------------------------ webdataset interop


def _read_tar(path) -> list[dict]:
    samples: dict[str, dict] = {}
    with tarfile.open(path) as tf:
        for m in tf:
            base = m.name.rsplit("/", 1)[-1]
            key = m.name[: len(m.name) - len(base)] + base.split(".", 1)[0]
            sample = samples.setdefault(key, {"__key__": key, "__url__": str(path)})
            sample[base.split(".", 1)[1]] = tf.extractfile(m).read()
    return list(samples.values())


def test_decode_webdataset_written_shard(tmp_path):
    wds = pytest.importorskip("webdataset")
    src = gradient()
    path = tmp_path / "wds-000000.tar"
    with wds.TarWriter(str(path)) as w:
        w.write({
            "__key__": "s000", "png": src, "jpg": src, "cls": 7, "json": {"a": [1, 2]}, "txt": "hi",
            "npy": np.arange(4, dtype=np.float32), "mp": {"m": 1}, "pyd": {"p": 1}, "seg.png": luma(src),
        })
    (sample,) = _read_tar(path)
    out = Decoder("rgb8", allow_pickle=True)(sample)
    np.testing.assert_array_equal(out["png"], src)
    assert np.abs(out["jpg"].astype(int) - src.astype(int)).mean() < 2
    assert out["cls"] == 7 and out["json"] == {"a": [1, 2]} and out["txt"] == "hi"
    np.testing.assert_array_equal(out["npy"], np.arange(4, dtype=np.float32))
    assert out["mp"] == {"m": 1} and out["pyd"] == {"p": 1}
    np.testing.assert_array_equal(Decoder("numpy", only="png")(sample)["seg.png"], luma(src))


def test_webdataset_decodes_our_encoding():
    wds = pytest.importorskip("webdataset")
    src = gradient()
    enc = Encoder()({
        "__key__": "s", "png": src, "jpg": src, "cls": 7, "json": {"a": 1}, "txt": "hi",
        "npy": np.arange(3), "mp": [1, 2], "json.gz": {"z": 0},
    })
    out = wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")])(enc)
    np.testing.assert_array_equal(out["png"], src)
    assert np.abs(out["jpg"].astype(int) - src.astype(int)).mean() < 2
    assert out["cls"] == 7 and out["json"] == {"a": 1} and out["txt"] == "hi" and out["mp"] == [1, 2]
    np.testing.assert_array_equal(out["npy"], np.arange(3))
    assert out["json.gz"] == {"z": 0}


def test_a_used_decoder_pickles_and_decides_per_entry_name_once():
    """Decoder keeps each entry name's decode function (some are lambdas): it must still pickle, and
    the remembered choice must be the one decode_value makes for every kind of entry."""
    d = Decoder("rgb8", only="txt cls json.gz npy")
    sample = {"__key__": "k", "txt": b"hi", "cls": b"3", "json.gz": gzip.compress(b'{"a": 1}'),
              "npy": _npy(np.arange(3)), "bin": b"\x00raw"}
    first = d(sample)
    again = pickle.loads(pickle.dumps(d))(sample)
    for out in (first, again, d(sample)):
        assert out["txt"] == "hi" and out["cls"] == 3 and out["json.gz"] == {"a": 1} and out["bin"] == b"\x00raw"
        assert np.array_equal(out["npy"], np.arange(3)) and out["__key__"] == "k"
    with pytest.raises(DecodeError, match="'cls'"):
        d({"__key__": "k", "cls": b"x"})


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_a_non_str_entry_name_is_the_jobs_error_naming_the_entry():
    """Not an AttributeError from deep inside (it read as bad input): a JobError naming the entry."""
    with pytest.raises(JobError, match=r"key 'k'.*output entry name 5 is int: entry names must be str"):
        Encoder()({"__key__": "k", "txt": b"x", 5: b"y"})
