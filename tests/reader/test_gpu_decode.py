"""The reader's GPU JPEG decode on a CUDA GPU (reader/gpu.py over codecs/gpu.py): batches a Loader
returns with decode="torchrgb8-cuda" hold the same images as the CPU decode, on the GPU, in every
layout the CPU path gives (batched, channels-last, float, single samples).

Every test here needs a GPU and skips without one. The same pipeline runs with device="cpu" on every
machine in tests/reader/test_dataset_loader.py (test_deferred_jpeg_path_decodes_in_the_main_process).
The module imports only what the core install and torch give, so bench/device_check.sh runs it on a
GPU machine as it is.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardflow import Loader, ShardDataset  # noqa: E402
from shardflow.codecs.gpu import cuda_available  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402
from tests.support.jobs import decoded_alike  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")]


def _jpeg(i: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:24, 0:32]
    image = np.stack([(x * 8 + i) % 256, (y * 10 + 3 * i) % 256, (x + y + rng.integers(0, 8, (24, 32))) % 256], -1)
    buf = io.BytesIO()
    Image.fromarray(image.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpu-reader")
    with ShardWriter(os.path.join(directory, "g-%03d.tar"), maxcount=10) as w:
        for i in range(30):
            w.write({"__key__": f"k{i:03d}", "jpg": _jpeg(i), "cls": str(i % 7).encode()})
    return sorted(str(p) for p in directory.glob("g-*.tar"))


def _cpu_images(urls) -> dict[str, torch.Tensor]:
    return {k: img for b in ShardDataset(urls, decode="torchrgb8", batch_size=8)
            for k, img in zip(b["__key__"], b["jpg"])}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_are_decoded_on_the_gpu(urls, num_workers):
    ref = _cpu_images(urls)
    ds = ShardDataset(urls, decode="torchrgb8-cuda", batch_size=8)
    assert ds.gpu_decode
    batches = list(Loader(ds, num_workers=num_workers))
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(ref)
    for b in batches:
        assert b["jpg"].is_cuda and b["jpg"].dtype == torch.uint8 and b["jpg"].shape[1:] == (3, 24, 32)
        assert all(decoded_alike(img, ref[k]) for k, img in zip(b["__key__"], b["jpg"]))
        assert not b["cls"].is_cuda  # only the JPEGs go to the GPU


def test_channels_last_and_float_specs_on_the_gpu(urls):
    ref = _cpu_images(urls)
    cl = next(iter(Loader(ShardDataset(urls, decode="torchrgb8-cuda", batch_size=8, channels_last=True),
                          num_workers=2)))
    assert cl["jpg"].is_cuda and cl["jpg"].is_contiguous(memory_format=torch.channels_last)
    assert all(decoded_alike(img, ref[k]) for k, img in zip(cl["__key__"], cl["jpg"]))
    floats = next(iter(ShardDataset(urls, decode="torchrgb-cuda", batch_size=8)))
    assert floats["jpg"].is_cuda and floats["jpg"].dtype == torch.float32
    assert 0.0 <= floats["jpg"].min().item() and floats["jpg"].max().item() <= 1.0
    as_uint8 = (floats["jpg"] * 255).round().to(torch.uint8)
    assert all(decoded_alike(img, ref[k]) for k, img in zip(floats["__key__"], as_uint8))
    single = next(iter(ShardDataset(urls, decode="torchrgb8-cuda")))  # no batch_size: one sample at a time
    assert single["jpg"].is_cuda and single["jpg"].shape == (3, 24, 32)
    assert decoded_alike(single["jpg"], ref[single["__key__"]])
