"""JPEGs decoded straight into their batch row (reader/place.py): whatever mixes into a batch (other
sizes, PNGs, CMYK JPEGs simplejpeg refuses, samples dropped after decoding), every image equals what
the codecs decode, in CHW and channels-last batches, in-process and through Loader workers."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardflow import Loader, ShardDataset  # noqa: E402
from shardflow.codecs import Decoder  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402


def image(i: int, size: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, quality=90)
    return buf.getvalue()


def sample(i: int) -> dict:
    """Mostly 16 px JPEGs; now and then 24 px, CMYK, a PNG named .jpg, a second image field, no cls."""
    kind = i % 7
    data = image(i, 24 if i % 21 == 3 else 16, mode="CMYK" if kind == 4 else "RGB")
    if kind == 5:
        data = image(i, 16, "PNG")  # under .jpg: simplejpeg refuses it, Pillow decodes it
    s = {"__key__": f"k{i:04d}", "jpg": data, "cls": str(i).encode()}
    if kind == 6 and i % 2:
        del s["cls"]  # to_tuple fails after the image was decoded: the sample is skipped
    if kind == 1:
        s["png"] = image(i, 16, "PNG")
    return s


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("place")
    expected = {}
    decode = Decoder("torchrgb8")
    with ShardWriter(os.path.join(d, "p-%03d.tar"), maxcount=20) as w:
        for i in range(70):
            s = sample(i)
            w.write(s)
            if "cls" in s:
                expected[s["__key__"]] = decode({"jpg": s["jpg"]})["jpg"]
    return sorted(str(p) for p in d.glob("p-*.tar")), expected


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_placed_batches_equal_the_codecs(shards, channels_last, workers):
    urls, expected = shards
    ds = ShardDataset(urls, decode="torchrgb8", batch_size=6, shuffle=10, seed=1, to_tuple="__key__ jpg cls",
                      on_error="skip", channels_last=channels_last, manifest=False)
    seen = {}
    for keys, images, _ in (Loader(ds, num_workers=workers) if workers else ds):
        if isinstance(images, torch.Tensor):
            assert images.is_contiguous(memory_format=torch.channels_last if channels_last else
                                        torch.contiguous_format)
        for k, img in zip(keys, images):
            seen[k] = img.clone()
    assert sorted(seen) == sorted(expected)
    for k, img in seen.items():
        assert torch.equal(img, expected[k]), k


def test_dict_samples_keep_their_field_order(shards):
    urls, _ = shards
    ds = ShardDataset(urls, decode="torchrgb8", batch_size=4, on_error="skip", manifest=False)
    raw = next(iter(ShardDataset(urls, decode=None, batch_size=4, manifest=False)))
    assert list(next(iter(ds))) == list(raw)


@pytest.mark.parametrize("channels_last", [False, True])
def test_smaller_and_larger_images_after_the_first_of_a_batch(tmp_path, channels_last):
    """Rows after the first are decoded without reading the JPEG header first (the batch buffer bounds
    them): a smaller image must not be taken for a placed one, a larger one must not overrun its row."""
    sizes = [24, 16, 32, 24, 24, 16, 24, 24, 24]
    decode = Decoder("torchrgb8")
    expected = {}
    with ShardWriter(os.path.join(tmp_path, "m-%03d.tar"), maxcount=100) as w:
        for i, size in enumerate(sizes):
            s = {"__key__": f"k{i}", "jpg": image(i, size), "cls": b"1"}
            w.write(s)
            expected[s["__key__"]] = decode({"jpg": s["jpg"]})["jpg"]
    ds = ShardDataset(sorted(str(p) for p in tmp_path.glob("m-*.tar")), decode="torchrgb8", batch_size=3,
                      to_tuple="__key__ jpg", channels_last=channels_last, manifest=False)
    seen = {}
    for keys, images in ds:
        for k, img in zip(keys, images):
            seen[k] = img
    assert sorted(seen) == sorted(expected)
    for k, img in seen.items():
        assert torch.equal(img, expected[k]), k
