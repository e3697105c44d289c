"""Codec micro-benchmarks: the numbers behind shardflow.codecs' defaults.

- JPEG -> rgb8 with simplejpeg vs Pillow (why the fast path exists).
- PNG encode at compress_level 1 vs Pillow's default 6 (why the Encoder defaults to 1): time and size.
- Decoder over a whole sample, and Decoder(only=...) skipping the image.

Run (after `pip install -e .`): python bench/bench_codecs.py [--size 512] [--repeat 50].
Images are synthetic but photo-like
(smooth gradients plus noise), so JPEG/PNG sizes are realistic rather than trivially compressible.
"""

from __future__ import annotations

import argparse
import io
import platform
import time
from typing import Callable

import numpy as np
from PIL import Image

from shardflow.codecs import Decoder, Encoder, decode_value, encode_value


def photo_like(size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([np.sin(6 * x + 1), np.cos(5 * y), np.sin(4 * (x + y))], axis=-1) * 0.4 + 0.5
    noise = rng.normal(0, 0.04, base.shape)
    return (np.clip(base + noise, 0, 1) * 255).astype(np.uint8)


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Best-of-3 mean seconds per call (best-of damps noise from other processes)."""
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    img = photo_like(args.size)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    jpg = buf.getvalue()
    print(f"# python {platform.python_version()}, image {args.size}x{args.size}, jpeg {len(jpg)} B")

    slow = per_call(lambda: decode_value("jpg", jpg, "rgb8", fast_jpeg=False), args.repeat)
    fast = per_call(lambda: decode_value("jpg", jpg, "rgb8", fast_jpeg=True), args.repeat)
    print(f"jpeg->rgb8  pillow {slow * 1e3:7.2f} ms   fast path {fast * 1e3:7.2f} ms   {slow / fast:.2f}x")

    for level in (1, 6, 9):
        t = per_call(lambda level=level: encode_value("png", img, png_compress_level=level), max(1, args.repeat // 5))
        n = len(encode_value("png", img, png_compress_level=level))
        print(f"png encode  level {level}: {t * 1e3:7.2f} ms  {n:9d} B")

    sample = Encoder()({"__key__": "k", "jpg": img, "json": {"label": 3, "tags": ["a", "b"]}, "cls": 3})
    decoders = {"Decoder('rgb8')": Decoder("rgb8"),
                "Decoder('rgb8', only='json cls')": Decoder("rgb8", only="json cls")}
    for name, dec in decoders.items():
        t = per_call(lambda dec=dec: dec(sample), args.repeat)
        print(f"{name:34s} {1 / t:9.0f} samples/s")


if __name__ == "__main__":
    main()
