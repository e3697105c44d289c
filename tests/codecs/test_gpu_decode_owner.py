"""One owner for GPU JPEG decode (codecs/gpu.py): the spec table, the `-cuda` suffix (`-gpu` a deprecated
alias) and the fallback rule, the same from a job's decoder and from the reader.

No GPU is needed: nvjpeg is stood in for by torchvision's CPU `decode_jpeg` on device "cpu", made to
refuse what nvjpeg refuses (a CMYK JPEG, a damaged one, and any batch holding one), and the machine
"without CUDA" is `cuda_available` patched to False, so these tests mean the same on a GPU machine.
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import shardflow as sf
from shardflow.codecs import Decoder, decode_value
from shardflow.codecs import gpu as gpu_codecs
from shardflow.codecs.gpu import GPU_SPECS, GpuJpegDecoder, decode_jpegs, gpu_spec, make_decoder, use_cuda
from shardflow.errors import DecodeError, JobError
from shardflow.reader.gpu import GpuDecoder
from shardflow.reader.values import RawJpeg, pack_jpegs
from shardflow.reader.warn_once import warned


def _jpeg(seed: int, mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "JPEG", quality=85)
    return buf.getvalue()


GOOD, CMYK, BROKEN = _jpeg(1), _jpeg(2, "CMYK"), b"\xff\xd8 not a jpeg"


@pytest.fixture
def fresh_notes(monkeypatch):
    """The once-per-process notes (alias, CPU fallback) said again in this test."""
    monkeypatch.setattr(gpu_codecs, "_said", set())


@pytest.fixture
def fake_nvjpeg(monkeypatch):
    """torchvision's decode_jpeg refusing what nvjpeg refuses: CMYK, damaged data, a batch holding one."""
    import torchvision.io as tvio

    real = tvio.decode_jpeg
    refused = {CMYK, BROKEN}
    calls: list[int] = []

    def decode_jpeg(data, *args, **kwargs):
        batch = data if isinstance(data, list) else [data]
        calls.append(len(batch))
        if any(view.numpy().tobytes() in refused for view in batch):
            raise RuntimeError("nvjpeg: unsupported")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(tvio, "decode_jpeg", decode_jpeg)
    return calls


def _no_cuda(monkeypatch) -> None:
    monkeypatch.setattr(gpu_codecs, "cuda_available", lambda: False)


def _cpu(data: bytes) -> torch.Tensor:
    return decode_value("jpg", data, "torchrgb8")


# -- the spec table and the suffix ------------------------------------------------------------------
@pytest.mark.parametrize("base", sorted(GPU_SPECS))
def test_both_suffixes_name_the_same_spec_for_jobs_and_the_reader(base, fresh_notes, monkeypatch):
    _no_cuda(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert gpu_spec(base + "-cuda") == gpu_spec(base + "-gpu") == base
        job = [make_decoder(base + suffix, device="auto") for suffix in ("-cuda", "-gpu")]
        reader = [sf.ShardDataset("unused-{0..1}.tar", decode=base + suffix).settings for suffix in ("-cuda", "-gpu")]
    assert all(isinstance(d, GpuJpegDecoder) and d.spec == base for d in job)
    assert [s.decode for s in reader] == [base, base] and not any(s.gpu_decode for s in reader)  # no CUDA
    assert gpu_spec(base) is None and gpu_spec(None) is None and gpu_spec("rgb8") is None


def test_the_alias_warns_once_and_the_suffix_never(fresh_notes):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            gpu_spec("torchrgb8-gpu")
            gpu_spec("torchrgb8-cuda")
    deprecations = [w for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1 and "'torchrgb8-cuda'" in str(deprecations[0].message)
    assert len(seen) == 1


def test_the_alias_warning_names_the_users_line(fresh_notes, monkeypatch):
    """Said where the user built the dataset (a DeprecationWarning from __main__ is shown by default)."""
    _no_cuda(monkeypatch)
    with pytest.warns(DeprecationWarning, match="deprecated") as seen:
        sf.ShardDataset("unused-{0..1}.tar", decode="torch-gpu")
    assert [Path(w.filename).name for w in seen if issubclass(w.category, DeprecationWarning)] == [Path(__file__).name]


@pytest.mark.parametrize("spec", ["rgb8-cuda", "pil-gpu"])
def test_a_suffix_on_a_spec_nvjpeg_cannot_give_is_refused_alike(spec, fresh_notes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="torchrgb8-cuda, torchrgb-cuda, torch-cuda"):
            make_decoder(spec)
        with pytest.raises(ValueError, match="torchrgb8-cuda, torchrgb-cuda, torch-cuda"):
            sf.ShardDataset("unused-{0..1}.tar", decode=spec)


# -- the fallback rule, per image ---------------------------------------------------------------------
@pytest.mark.slow
def test_refused_images_alone_go_to_the_cpu(fake_nvjpeg, fresh_notes):
    views = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in (GOOD, CMYK, BROKEN, GOOD)]
    with pytest.warns(UserWarning, match="decoded on the CPU"):
        out = decode_jpegs(views, "cpu")
    assert fake_nvjpeg == [4, 1, 1, 1, 1]  # the batch call, then each JPEG alone
    assert torch.equal(out[1], _cpu(CMYK))  # refused: the CPU codec (Pillow)
    assert isinstance(out[2], DecodeError)  # neither reads it: this image's error, not the batch's
    assert out[0].shape == out[3].shape == (3, 6, 8) and out[0].dtype == torch.uint8
    assert decode_jpegs([], "cpu") == []


def test_without_torchvision_every_image_goes_to_the_cpu(monkeypatch, fresh_notes):
    monkeypatch.setitem(sys.modules, "torchvision.io", None)  # import fails
    with pytest.warns(UserWarning, match="decoded on the CPU"):
        out = decode_jpegs([torch.frombuffer(bytearray(GOOD), dtype=torch.uint8)], "cpu")
    assert torch.equal(out[0], _cpu(GOOD))


@pytest.mark.parametrize("spec", sorted(GPU_SPECS))
def test_a_jobs_decoder_and_the_reader_apply_the_same_rule(spec, fake_nvjpeg, fresh_notes):
    """The same JPEGs give the same tensors from a job's GpuJpegDecoder and the reader's GpuDecoder, and
    an image no decoder reads fails its sample (job) or the batch with a DecodeError (reader)."""
    job = make_decoder(spec + "-cuda", device="auto")
    job._on_gpu, job.device = True, "cpu"
    reader = GpuDecoder(spec, "cpu")
    samples = [{"__key__": f"k{i}", "jpg": d} for i, d in enumerate((GOOD, CMYK, BROKEN))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback's note, checked above
        from_job = job.decode_batch(samples)
        batch = reader(pack_jpegs([RawJpeg(GOOD), RawJpeg(CMYK)], single=False))
        single = reader(pack_jpegs([RawJpeg(CMYK)], single=True))
    expected = [_cpu(GOOD), _cpu(CMYK)]
    if GPU_SPECS[spec]:
        expected = [e.float() / 255 for e in expected]
    assert batch.shape == (2, 3, 6, 8) and batch.dtype == expected[0].dtype
    for i in (0, 1):
        assert torch.equal(from_job[i]["jpg"], batch[i])
    assert torch.equal(batch[1], expected[1]) and torch.equal(single, expected[1])
    assert isinstance(from_job[2], DecodeError) and from_job[2].key == "k2"
    with pytest.raises(DecodeError, match="JPEG 1 of the batch"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader(pack_jpegs([RawJpeg(GOOD), RawJpeg(BROKEN)], single=False))


# -- the fallback rule without CUDA ------------------------------------------------------------------
def test_without_cuda_a_job_needs_auto_and_the_reader_warns(monkeypatch, tmp_path, fresh_notes):
    """No CUDA: the CPU spec decodes everything, for a job with device="auto" and for the reader (with a
    warning); a job without "auto" fails in one line. Same values from both, equal to the CPU spec's."""
    _no_cuda(monkeypatch)
    with pytest.raises(JobError, match="device='auto'") as refused:
        make_decoder("torchrgb8-cuda", device="cuda").check()
    assert "\n" not in str(refused.value)
    with pytest.raises(JobError, match="needs a CUDA GPU"):
        use_cuda("x", fallback=False)
    assert use_cuda("x", fallback=True) is False

    with sf.TarWriter(str(tmp_path / "a.tar")) as writer:
        writer.write({"__key__": "k0", "jpg": GOOD})
    warned.clear()
    with pytest.warns(UserWarning, match="no CUDA device"):
        dataset = sf.ShardDataset(str(tmp_path / "a.tar"), decode="torchrgb8-cuda")
    from_reader = next(iter(dataset))["jpg"]
    from_job = make_decoder("torchrgb8-cuda", device="auto")({"__key__": "k0", "jpg": GOOD})["jpg"]
    from_cpu = Decoder("torchrgb8")({"__key__": "k0", "jpg": GOOD})["jpg"]
    assert torch.equal(from_reader, from_cpu) and torch.equal(from_job, from_cpu)
