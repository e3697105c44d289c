"""The ready batched jobs: augment_batch (same bytes on rerun and for any batch size) and features (a
torchvision model built once per worker, weights=None or a checkpoint; the rest of the sample kept)."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest

from shardflow.job.jobfile import load_job
from shardflow.shards.samples import read_samples
from tests.support.jobs import file_bytes, make_shards, spec, tars


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 7, size=(48, 40))
    return directory


def _run(name, shards, out, overrides=None, **kwargs):
    job = load_job(name, inputs=spec(shards, "in", 2), outputs=str(out / "{name}.tar"), overrides=overrides,
                   **kwargs)
    report = job.run("serial", progress=False)
    assert report.ok, report
    return [s for p in tars(out) for s in read_samples(str(p))]


def test_augment_batch_is_reproducible_whatever_the_batch_size(shards, tmp_path):
    from PIL import Image

    first = _run("augment_batch", shards, tmp_path / "a", {"size": 32})
    _run("augment_batch", shards, tmp_path / "b", {"size": 32})
    _run("augment_batch", shards, tmp_path / "c", {"size": 32, "batch_size": 3})
    a, b, c = (file_bytes(tars(tmp_path / d)) for d in "abc")
    assert a == b == c and len(first) == 14
    image = Image.open(io.BytesIO(first[0]["jpg"]))
    assert image.size == (32, 32) and image.format == "JPEG" and first[0]["cls"] == b"0"
    other = _run("augment_batch", shards, tmp_path / "d", {"size": 32}, seed=1)
    assert [s["jpg"] for s in other] != [s["jpg"] for s in first]  # random per seed
    assert len({s["jpg"] for s in first}) == 14  # and per sample


def test_features_with_random_weights_keeps_the_sample(shards, tmp_path):
    samples = _run("features", shards, tmp_path / "f", {"size": 32, "model": "mobilenet_v3_small"})
    source = {s["__key__"]: s for p in sorted(shards.glob("*.tar")) for s in read_samples(str(p))}
    assert len(samples) == 14
    for sample in samples:
        vector = np.load(io.BytesIO(sample["features.npy"]))
        assert vector.shape == (576,) and vector.dtype == np.float32 and np.isfinite(vector).all()
        original = source[sample["__key__"]]
        assert sample["jpg"] == original["jpg"] and sample["json"] == original["json"]


def test_features_from_a_checkpoint(shards, tmp_path):
    import torch
    import torchvision

    torch.manual_seed(3)
    model = torchvision.models.get_model("mobilenet_v3_small", weights=None)
    checkpoint = tmp_path / "model.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    settings = {"size": 32, "model": "mobilenet_v3_small", "checkpoint": str(checkpoint)}
    loaded = _run("features", shards, tmp_path / "f", settings)
    model.classifier = torch.nn.Identity()
    first = source_image(shards)
    with torch.inference_mode():
        from shardflow.jobs_builtin.features import prepare

        expected = model.eval()(prepare(first, 32)[None])[0].numpy()
    got = np.load(io.BytesIO(loaded[0]["features.npy"]))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    missing = load_job("features", inputs=spec(shards, "in", 2), outputs=str(tmp_path / "m" / "{name}.tar"),
                       overrides={"checkpoint": str(tmp_path / "nope.pt")}).run("serial", progress=False)
    assert not missing.ok and missing.done == 0 and "setup() of features.py failed" in missing.failed[0]["error"]


def source_image(shards):
    from shardflow.codecs import Decoder

    first = next(read_samples(str(sorted(shards.glob("*.tar"))[0])))
    return Decoder("torchrgb8")(first)["jpg"]


def test_augment_batch_crops_like_torchvision_without_importing_it():
    """The job's crop + resize gives torchvision v2's resized_crop pixels, on a CHW tensor and on the
    channels-last view of a decoded HWC array, and the job file does not import torchvision."""
    import torch
    from torchvision.transforms.v2 import functional as F

    from shardflow.job.jobfile import load_job_file

    job = load_job_file("augment_batch")
    names = [getattr(v, "__name__", "") if isinstance(v, types.ModuleType) else getattr(v, "__module__", "") or ""
             for v in vars(job.module).values()]
    assert not [n for n in names if n.startswith("torchvision")]
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (384, 512, 3), dtype=np.uint8)
    views = (torch.from_numpy(hwc).permute(2, 0, 1), torch.from_numpy(hwc).permute(2, 0, 1).contiguous())
    for top, left, height, width, size in [(0, 0, 384, 512, 224), (10, 20, 300, 200, 224), (50, 7, 31, 97, 64)]:
        want = F.resized_crop(views[1], top, left, height, width, [size, size], antialias=True)
        for image in views:
            assert torch.equal(job.module.resized_crop(image, top, left, height, width, size), want)
