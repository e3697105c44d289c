"""resize: scale each image so its shorter side is PARAMS["size"], optionally centre-crop, re-encode as JPEG.

The image (the first of jpg, jpeg, png, webp, or PARAMS["image_key"]) is decoded with Pillow only
(JPEGs in draft mode: the decoder itself downscales by 2, 4 or 8 when the target is small enough,
which makes large downscales several times faster), resized with a Lanczos filter, centre-cropped
to size x size when PARAMS["crop"], and written as `jpg` at PARAMS["quality"]. The other entries of
the sample (json, cls, txt...) are copied byte for byte. Images already small enough are re-encoded
but not enlarged unless PARAMS["upscale"].

Run it:

    shardflow run resize --inputs 'data/train-{000000..000099}.tar' --outputs 'small/{name}.tar' \\
        --set size=256 --set crop=true --set quality=85

PARAMS (all settable with --set):
    size       target length of the shorter side, in pixels
    crop       centre-crop to size x size after resizing
    quality    JPEG quality of the output (1..95)
    upscale    also enlarge images whose shorter side is below size
    image_key  entry holding the image (null: the first of jpg, jpeg, png, webp)
"""

import io

from PIL import Image

import shardflow as sf

JOB = dict(decode=None)  # raw bytes: the image is decoded here (draft mode), the rest copied as is
PARAMS = dict(size=256, crop=False, quality=90, upscale=False, image_key=None)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


def resize_image(data, size, crop=False, upscale=False):
    """Encoded image bytes -> a PIL RGB image whose shorter side is `size` (centre-cropped if asked)."""
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    scale = size / min(width, height)
    if scale > 1 and not upscale:
        scale = 1.0
    target = (max(1, round(width * scale)), max(1, round(height * scale)))
    if image.format == "JPEG":
        image.draft("RGB", target)  # decode at 1/2, 1/4 or 1/8 scale when that is still >= target
    image = image.convert("RGB")
    if image.size != target:
        image = image.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    if crop:
        side = min(size, *image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        image = image.crop((left, top, left + side, top + side))
    return image


def process(sample):
    key = PARAMS["image_key"] or next((k for k in IMAGE_KEYS if k in sample), None)
    if key is None or key not in sample:
        raise sf.SkipSample("no image")
    image = resize_image(sample[key], PARAMS["size"], PARAMS["crop"], PARAMS["upscale"])
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=PARAMS["quality"])
    out = {k: v for k, v in sample.items() if k != key and k != "__url__"}
    out["jpg"] = buf.getvalue()
    return out
