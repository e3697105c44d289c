"""Image entries: decode to the container/mode/dtype an image spec names, encode from PIL images,
arrays and tensors.

Decoding takes simplejpeg's faster path for RGB JPEGs when it is installed. Encoding uses Pillow
(never simplejpeg), so the bytes do not depend on optional extras, except for 8-bit L/RGB/RGBA PNG,
which shardflow's own writer makes (codecs.png: 1.5-4x faster than Pillow's encoder): at levels 2-9
Pillow's bytes exactly, at levels 0-1 its own, deflated by the engine `png_deflate` names
(codecs.deflate).
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardflow.codecs.deflate import check_engine
from shardflow.codecs.planes import preload as preload_planes
from shardflow.codecs.planes import to_planes
from shardflow.codecs.png import encode_png
from shardflow.codecs.tensors import import_torch, is_tensor, tensor_to_numpy

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff"}
)
_JPEG = frozenset({"jpg", "jpeg"})

# spec -> (container, PIL mode to convert to or None to keep the stored one, scale to float32 [0, 1])
IMAGE_SPECS: dict[str, tuple[str, str | None, bool]] = {
    "pil": ("pil", "RGB", False),
    "pilrgb": ("pil", "RGB", False),
    "pilrgba": ("pil", "RGBA", False),
    "pill": ("pil", "L", False),
    "numpy": ("numpy", None, False),  # pixel values exactly as stored (see decode_image)
    "rgb8": ("numpy", "RGB", False),
    "rgba8": ("numpy", "RGBA", False),
    "l8": ("numpy", "L", False),
    "rgb": ("numpy", "RGB", True),
    "rgba": ("numpy", "RGBA", True),
    "l": ("numpy", "L", True),
    "torchrgb8": ("torch", "RGB", False),
    "torchrgba8": ("torch", "RGBA", False),
    "torchl8": ("torch", "L", False),
    "torchrgb": ("torch", "RGB", True),
    "torch": ("torch", "RGB", True),
    "torchrgba": ("torch", "RGBA", True),
    "torchl": ("torch", "L", True),
}

_PIL_FORMATS = {
    "jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "ppm": "PPM", "pgm": "PPM",
    "pbm": "PPM", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF",
}  # fmt: skip


def check_spec(spec: str | None) -> None:
    """Refuse an unknown image spec when a Decoder is made, not on the first image of a shard."""
    if spec is not None and spec not in IMAGE_SPECS:
        raise ValueError(f"unknown image spec {spec!r}; use None or one of: {', '.join(IMAGE_SPECS)}")


# ----------------------------------------------------------------------------------------- decoding


@functools.lru_cache(maxsize=None)
def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def preload_decoders() -> None:
    """Import what image decoding needs (simplejpeg, OpenCV's channel split, Pillow and its common
    plugins) now: done before forking DataLoader workers, each of them starts with it instead of
    importing it again."""
    _simplejpeg()
    preload_planes()
    from PIL import Image

    Image.preinit()  # the common formats (JPEG, PNG, ...); Image.init() would import every plugin


def jpeg_size(data: Any) -> tuple[int, int] | None:
    """(height, width) of a JPEG simplejpeg can decode to RGB, or None: no simplejpeg, not a JPEG it
    reads, or larger than Pillow's decompression-bomb limit (Pillow then decides and explains)."""
    sj = _simplejpeg()
    if sj is None:
        return None
    try:
        height, width, _, _ = sj.decode_jpeg_header(data)
    except Exception:  # not really a JPEG, ...
        return None
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and height * width > 2 * Image.MAX_IMAGE_PIXELS:
        return None  # keep Pillow's decompression-bomb refusal on the fast path too
    return height, width


def decode_jpeg_into(data: Any, out: np.ndarray) -> bool:
    """Decode an RGB JPEG straight into `out` (C-contiguous uint8 HWC): no fresh array.

    False when simplejpeg cannot (CMYK, damage, ...) or the image is not exactly `out`'s size (a
    larger one is refused before anything is written, a smaller one fills the start of `out`):
    decode_image then decodes or explains. `out` bounds the pixels, so a caller that sized it from
    an image jpeg_size accepted needs no header check of its own for the next images."""
    try:
        image = _simplejpeg().decode_jpeg(data, colorspace="RGB", buffer=out)
    except Exception:
        return False
    return image.shape == out.shape


def _decode_jpeg_fast(data: bytes) -> np.ndarray | None:
    """RGB HWC uint8 via simplejpeg, or None to let Pillow decode (and explain any failure)."""
    if jpeg_size(data) is None:
        return None
    try:
        return _simplejpeg().decode_jpeg(data, colorspace="RGB")
    except Exception:  # CMYK, ...
        return None


def decode_image(data: bytes, spec: str, last: str, fast_jpeg: bool) -> Any:
    """Decode to the container/mode/dtype that ``spec`` names.

    ``numpy`` keeps pixel values as stored: L -> HW uint8, P -> HW uint8 palette indices (what masks
    need), RGB(A) -> HWC uint8, 16-bit -> HW uint16, 1-bit -> HW bool. Torch results are contiguous CHW
    (HW for l specs), so collation and pin_memory do not copy again.
    """
    container, mode, as_float = IMAGE_SPECS[spec]
    arr = None
    if fast_jpeg and mode == "RGB" and container != "pil" and last in _JPEG:
        arr = _decode_jpeg_fast(data)
    if arr is None:
        from PIL import Image

        img = Image.open(io.BytesIO(data))
        img.load()
        if mode is not None and img.mode != mode:
            img = img.convert(mode)
        if container == "pil":
            return img
        arr = np.asarray(img)
        if not arr.flags.writeable and not as_float and container == "numpy":
            arr = arr.copy()  # Pillow's buffer is read-only; users modify arrays in place
    if container == "torch" and arr.ndim == 3:
        arr = to_planes(arr)  # a copy: writable
    if as_float:
        arr = np.divide(arr, 255, dtype=np.float32)
    elif container == "torch" and not arr.flags.writeable:
        arr = arr.copy()  # torch warns on (and cannot protect) read-only numpy memory
    if container == "torch":
        return import_torch().from_numpy(arr)
    return arr


# ----------------------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class ImageOptions:
    """Encoder quality settings, checked once when the Encoder is made (and pickled with it)."""

    jpeg_quality: int = 90
    png_compress_level: int = 1
    webp_quality: int = 90
    png_deflate: str = "isal"  # the PNG writer's deflate engine at level 1 (codecs.deflate)

    def __post_init__(self) -> None:
        limits = (("jpeg_quality", 1, 100), ("png_compress_level", 0, 9), ("webp_quality", 0, 100))
        for name, lo, hi in limits:
            v = getattr(self, name)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in {lo}..{hi}, got {v!r}")
        check_engine(self.png_deflate, self.png_compress_level)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Options pickled before `png_deflate` existed (job.pkl of a run directory) keep writing the
        zlib bytes that run started with: a resumed run must not mix two encodings of its PNGs."""
        self.__dict__.update({"png_deflate": "zlib", **state})


# Float pixels are [0, 1]; values within half a grey level outside it are rounding, not a mistake.
FLOAT_TOLERANCE = 0.5 / 255


def _check_float_range(arr: np.ndarray) -> None:
    """Refuse float pixels outside [0, 1]: clipping a 0..255 image (no /255) or a [-1, 1] tensor would
    silently write a white or half-black picture (webdataset raises too). NaN is left to the caller."""
    lo, hi = float(np.nanmin(arr, initial=0.5)), float(np.nanmax(arr, initial=0.5))  # initial: empty, all-NaN
    if lo >= -FLOAT_TOLERANCE and hi <= 1 + FLOAT_TOLERANCE:
        return
    finite = arr[~np.isnan(arr)]
    lo, hi = float(finite.min()), float(finite.max())
    hint = " (scale 0..255 images by 1/255)" if hi > 1 + FLOAT_TOLERANCE else " (map [-1, 1] by (x + 1) / 2)"
    raise ValueError(f"float pixels must be in [0, 1], got values in [{lo:g}, {hi:g}]{hint}")


def _float_to_uint8(arr: np.ndarray) -> np.ndarray:
    """[0, 1] floats -> C-contiguous uint8 by rounding (out of range: ValueError, see _check_float_range),
    NaN -> 0."""
    work = arr.astype(np.float32) if arr.dtype.itemsize < 4 else arr
    # The usual case (no NaN: min/max propagate it; nothing to clip) skips the clip's two passes and
    # writes C order at once, so a CHW tensor's HWC view costs no extra transposing copy in to_pil.
    if work.size and 0.0 <= work.min() and work.max() <= 1.0:
        work = np.multiply(work, 255.0, dtype=work.dtype, order="C")
    else:
        _check_float_range(arr)
        work = np.fmin(np.fmax(work, 0.0), 1.0, order="C")  # fmax/fmin map NaN to the bound, without warnings
        work *= 255.0
    np.rint(work, out=work)
    return work.astype(np.uint8)


def _image_array(value: Any) -> np.ndarray:
    """An HW/HWC array from an array or a CHW/HW torch tensor (shape checked, dtype not yet)."""
    if is_tensor(value):
        arr = tensor_to_numpy(value)
        if arr.ndim == 3:
            if arr.shape[0] not in (1, 3, 4):
                raise ValueError(f"a 3-d tensor must be CHW with 1, 3 or 4 channels, got {tuple(arr.shape)}")
            arr = arr.transpose(1, 2, 0)
    elif isinstance(value, np.ndarray):
        arr = value
    else:
        raise TypeError("expected a PIL image, numpy array or torch tensor")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise ValueError(f"image arrays must be HW or HWC with 1, 3 or 4 channels, got shape {arr.shape}")
    return arr


def to_pil(value: Any) -> Any:
    """PIL image from a PIL image, an HW/HWC array, or a CHW/HW torch tensor."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    arr = _image_array(value)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8) * 255
    elif arr.dtype.kind == "f":
        arr = _float_to_uint8(arr)
    elif arr.dtype == np.uint16 and arr.ndim == 2:
        pass  # 16-bit grayscale (depth maps); png and tiff keep it
    elif arr.dtype != np.uint8:
        if arr.dtype.kind not in "iu" or (arr.size and (arr.min() < 0 or arr.max() > 255)):
            raise ValueError(
                f"cannot store {arr.dtype} pixels: use uint8, floats in [0, 1], or integers in 0..255"
            )
        arr = arr.astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(arr))


def encode_image(last: str, value: Any, opts: ImageOptions) -> bytes:
    """Bytes of an image value in the format extension ``last`` names (``"png"``, ``"jpg"``, ...)."""
    img = to_pil(value)
    fmt = _PIL_FORMATS[last]
    params: dict[str, Any] = {}
    if fmt == "JPEG":
        if img.mode not in ("L", "RGB", "CMYK"):
            img = img.convert("L" if img.mode in ("1", "LA", "I;16") else "RGB")  # JPEG has no alpha
        params["quality"] = opts.jpeg_quality
    elif fmt == "PNG":
        own = encode_png(img, opts.png_compress_level, opts.png_deflate)
        if own is not None:
            return own
        params["compress_level"] = opts.png_compress_level
    elif fmt == "WEBP":
        params["quality"] = opts.webp_quality
    elif last == "pgm" and img.mode != "L":
        img = img.convert("L")
    elif last == "pbm" and img.mode != "1":
        img = img.convert("1")
    elif fmt in ("PPM", "BMP") and img.mode not in ("1", "L", "RGB"):
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()
