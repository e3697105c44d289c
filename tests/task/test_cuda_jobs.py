"""Jobs on a CUDA GPU (codecs/gpu.py, task/devices.py): nvjpeg decode against the CPU decode, the GPU
JPEG encode, a device job end to end on the processes backend.

Every test here needs a GPU and skips without one (`needs_cuda`). The module imports only what the
core install has, so a GPU machine lent for a few minutes runs it as it is: bench/device_check.sh.
The same paths run on the CPU (torchvision's CPU decode in nvjpeg's place) in tests/task/test_devices.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import shardflow as sf
from shardflow.codecs.gpu import cuda_available, encode_on_device, make_decoder
from shardflow.shards.samples import read_samples
from tests.support.jobs import decoded_alike, file_bytes, make_shards, spec, tars, tiny_jpeg

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 5, bad=["s000003"])
    return directory


def test_cuda_decode_matches_cpu_decode(shards):
    import torch

    samples = [s for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))]
    decoded = make_decoder("torchrgb8-cuda").decode_batch(samples)
    cpu = make_decoder("torchrgb8")
    for sample, gpu in zip(samples, decoded):
        if sample["__key__"] == "s000003":
            assert isinstance(gpu, Exception) and "s000003" in str(gpu)
            continue
        assert gpu["jpg"].is_cuda and gpu["jpg"].dtype == torch.uint8
        assert decoded_alike(gpu["jpg"], cpu(sample)["jpg"])


def test_a_jpeg_nvjpeg_refuses_is_decoded_alone_and_a_broken_one_fails_alone():
    """One batch call first; when it fails, each JPEG alone, the CPU codec for what nvjpeg refuses: the
    good images still come back on the GPU, the broken one is its own sample's error."""
    import torch
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((6, 8, 3), 120, np.uint8)).convert("CMYK").save(buf, "JPEG")
    samples = [{"__key__": "a", "jpg": tiny_jpeg(1)}, {"__key__": "cmyk", "jpg": buf.getvalue()},
               {"__key__": "broken", "jpg": b"\xff\xd8 not really"}, {"__key__": "e", "jpg": tiny_jpeg(2)}]
    out = make_decoder("torchrgb8-cuda").decode_batch(samples)
    cpu = make_decoder("torchrgb8")
    for i in (0, 3):
        assert out[i]["jpg"].is_cuda and out[i]["jpg"].dtype == torch.uint8
        assert decoded_alike(out[i]["jpg"], cpu(samples[i])["jpg"])
    # CMYK: decoded by nvjpeg or by the CPU codec, either way an RGB image on the GPU (the two may convert
    # CMYK to RGB differently, so only its form is checked, as on the CPU in test_devices.py)
    assert out[1]["jpg"].is_cuda and tuple(out[1]["jpg"].shape) == (3, 6, 8)
    assert isinstance(out[2], Exception) and getattr(out[2], "key", None) == "broken"


def test_gpu_jpeg_encode_decodes_back_to_the_image():
    """encode_on_device: CUDA images (uint8, and floats in [0, 1]) become JPEG bytes in one batched call,
    which any decoder reads back close to the image; floats outside [0, 1] are refused as on the CPU."""
    import torch

    y, x = np.mgrid[0:48, 0:64]
    smooth = np.stack([x * 4, y * 5, (x + y) * 2], -1).astype(np.uint8)  # gradients: JPEG keeps them closely
    image = torch.from_numpy(smooth).permute(2, 0, 1).contiguous().cuda()
    samples = [{"__key__": "u8", "jpg": image, "cls": 1}, {"__key__": "f", "jpg": image.float() / 255},
               {"__key__": "cpu", "jpg": image.cpu()}]
    out = encode_on_device(samples, 95)
    assert isinstance(out[0]["jpg"], bytes) and isinstance(out[1]["jpg"], bytes) and out[0]["cls"] == 1
    assert out[2]["jpg"] is samples[2]["jpg"]  # a CPU tensor is left to the CPU encoder
    back = make_decoder("torchrgb8")
    for sample in out[:2]:
        assert decoded_alike(back({"jpg": sample["jpg"]})["jpg"], image)
    with pytest.raises(ValueError, match=r"float pixels must be in \[0, 1\]"):
        encode_on_device([{"__key__": "x", "jpg": image.float()}], 95)  # forgot the /255


def test_cuda_job_end_to_end(shards, tmp_path):
    def fn(batch):
        return [{"__key__": s["__key__"], "jpg": s["jpg"].flip(-1)} for s in batch]

    job = sf.ShardJob(fn, spec(shards, "in", 2), str(tmp_path / "o" / "{name}.tar"), decode="torchrgb8-cuda",
                      device="cuda", batch_size=4)
    first = job.run("processes", progress=False)
    assert first.ok and first.stats.samples_out == 9 and sf.worker_device() in ("cuda", "cpu")
    assert sf.ShardJob(fn, spec(shards, "in", 2), str(tmp_path / "p" / "{name}.tar"), decode="torchrgb8-cuda",
                        device="cuda", batch_size=4).run("processes", progress=False).ok
    assert file_bytes(tars(tmp_path / "o")) == file_bytes(tars(tmp_path / "p"))  # same GPU: same bytes
