"""GPU JPEG decode for jobs AND the reader (one owner), and JPEG encode of CUDA tensors on the GPU.

This module is the one owner of three things both users of GPU decode (a job's `decode=`, in
job/shard_job.py, and the reader's `ShardDataset(decode=)`, in reader/settings.py and reader/gpu.py)
must agree on, so that a spec means the same wherever it is written:

- the spec table, `GPU_SPECS`: `torchrgb8` (uint8), `torchrgb` and `torch` (float in [0, 1]);
- the suffix, `-cuda` (`decode="torchrgb8-cuda"`). `-gpu`, the reader's old spelling, is a
  deprecated alias: it still works, and says so once per process (DeprecationWarning);
- the fallback rule (`decode_jpegs`, `use_cuda`), below.

The fallback rule. A batch's JPEGs go to nvjpeg in one `torchvision.io.decode_jpeg(list, device=)`
call; when that call fails, each JPEG is retried alone, and a JPEG nvjpeg refuses (CMYK, some
progressive files, no nvjpeg or no torchvision at all) is decoded by the CPU codec of `torchrgb8`
and moved to the device; one that neither decodes is that image's error, never the batch's. Of the
two rules this module replaces, the jobs' one (per image) is the right one for both: the reader's old
rule decoded the WHOLE batch on the CPU when one image was refused (one CMYK file in 256 made the
batch tens of times slower) and let one broken JPEG fail its batch without saying which. Images go
to the CPU only where nvjpeg cannot take them, and a process says once that it happened.
Without CUDA at all, the CPU spec (the spec without the suffix) decodes everything: the same values,
on the CPU. Whether that is allowed is `use_cuda(what, fallback=)`: a job allows it only with
device="auto" (a GPU job landing on a CPU worker by mistake would otherwise run many times slower
unnoticed), the reader always, with a warning (its `device=` names where batches go, not a demand).

`encode_on_device` writes JPEG entries holding CUDA image tensors with `torchvision.io.encode_jpeg`
on the GPU (one call per batch); everything else is left to the Encoder (CPU: PNG stays there).
GPU JPEG bytes differ from Pillow's: a GPU job's outputs are reproducible on the same GPU type and
driver, not across CPU and GPU.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Sequence

from shardflow.codecs.decoder import Decoder, decode_value
from shardflow.codecs.images import FLOAT_TOLERANCE, _check_float_range
from shardflow.codecs.tensors import is_tensor
from shardflow.errors import DecodeError, JobError, ShardflowError

CUDA_SUFFIX = "-cuda"
DEPRECATED_SUFFIX = "-gpu"  # the reader's old spelling (decode="torchrgb8-gpu"): same meaning, warns once
ALIASES = (DEPRECATED_SUFFIX,)
GPU_SPECS = {"torchrgb8": False, "torchrgb": True, "torch": True}  # spec -> scaled to float [0, 1]
_JPEG = ("jpg", "jpeg")
_said: set[str] = set()  # the once-per-process notes already given (a test clears it to see one again)


def gpu_spec(spec: Any, *, stacklevel: int = 2) -> str | None:
    """The CPU spec a GPU decode spec names ("torchrgb8-cuda" -> "torchrgb8"), None for any other spec.

    The one parser of the suffix, so jobs and the reader accept the same spellings; a suffix on a spec
    nvjpeg cannot produce is a ValueError listing the ones it can. `-gpu` warns once per process.
    """
    if not isinstance(spec, str):
        return None
    suffix = next((s for s in (CUDA_SUFFIX, *ALIASES) if spec.endswith(s)), None)
    if suffix is None:
        return None
    base = spec[: -len(suffix)]
    if base not in GPU_SPECS:
        names = ", ".join(name + CUDA_SUFFIX for name in GPU_SPECS)
        raise ValueError(f"decode={spec!r}: GPU decode gives {names}")
    if suffix != CUDA_SUFFIX:
        _say_once(f"decode={spec!r}: the {suffix!r} suffix is deprecated, write {base + CUDA_SUFFIX!r}",
                  DeprecationWarning, stacklevel + 1)
    return base


def _say_once(message: str, category: type[Warning], stacklevel: int) -> None:
    """Warn once per process: these describe a setup, and batches (or workers) would repeat them."""
    if message not in _said:
        _said.add(message)
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def no_cuda_message(what: str) -> str:
    return (f"{what} needs a CUDA GPU and this worker has none (torch.cuda.is_available() is False); "
            "run it where a GPU is visible, or set device='auto' to fall back to the CPU")


def use_cuda(what: str, *, fallback: bool) -> bool:
    """The no-GPU half of the rule: True with CUDA; without it False (the CPU spec decodes everything)
    where `fallback` allows it, else JobError in one line naming `what`."""
    if cuda_available():
        return True
    if not fallback:
        raise JobError(no_cuda_message(what))
    return False


def decode_jpegs(views: Sequence[Any], device: Any) -> list[Any]:
    """The per-image half of the rule: for each JPEG (a uint8 CPU tensor of its bytes), a uint8 CHW RGB
    tensor on `device`, or the exception that image's decode raised. nvjpeg over the whole batch first,
    then alone, then the CPU codec for what nvjpeg refused."""
    if not views:
        return []
    try:
        import torchvision.io as tvio
    except ImportError:  # the CPU codec needs only torch
        tvio = None
    if tvio is not None:
        try:
            return list(tvio.decode_jpeg(list(views), mode=tvio.ImageReadMode.RGB, device=device))
        except Exception:  # noqa: BLE001 - one refused JPEG fails the batch call: decode one by one
            pass
    return [_decode_one(tvio, view, device) for view in views]


def _decode_one(tvio: Any, view: Any, device: Any) -> Any:
    if tvio is not None:
        try:
            return tvio.decode_jpeg(view, mode=tvio.ImageReadMode.RGB, device=device)
        except Exception:  # noqa: BLE001 - CMYK & co: the CPU decodes it (Pillow), then to the device
            pass
    _say_once("GPU JPEG decode refused some images (CMYK, progressive, damaged, or no nvjpeg here); "
              "they are decoded on the CPU", UserWarning, 4)
    try:
        return decode_value("jpg", view.numpy().tobytes(), "torchrgb8").to(device)
    except Exception as exc:  # noqa: BLE001 - this image's failure, reported by the caller
        return exc


def to_spec(image: Any, spec: str) -> Any:
    """A decoded uint8 image as `spec` gives it: uint8, or float in [0, 1] (in place on a new tensor)."""
    return image.float().div_(255) if GPU_SPECS[spec] else image


def make_decoder(spec: str, *, allow_pickle: bool = False, device: str | None = None) -> Callable[..., Any]:
    """The decoder of a job's `decode` setting: a CPU Decoder, or a GpuJpegDecoder for `<spec>-cuda`."""
    base = gpu_spec(spec, stacklevel=2)
    if base is None:
        return Decoder(spec, allow_pickle=allow_pickle)
    return GpuJpegDecoder(base, Decoder(base, allow_pickle=allow_pickle), fallback=device == "auto")


class GpuJpegDecoder:
    """A job's GPU decode: samples with their JPEGs decoded together on the GPU (a batch at a time,
    `decode_jpegs`), every other entry by `cpu` (the spec without the suffix) and moved there."""

    def __init__(self, spec: str, cpu: Decoder, *, fallback: bool = False) -> None:
        self.spec, self.cpu, self.fallback = spec, cpu, fallback
        self._on_gpu: bool | None = None  # decided on this worker, on first use
        self.device = "cuda"  # where decoded images go ("cpu" in tests: the same batching and fallbacks)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_on_gpu": None}  # the driver's answer is not the worker's

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_cpu_jpeg", None)  # job.pkl of earlier versions carried a CPU JPEG decoder
        self.__dict__.update(state)

    def check(self) -> None:
        """Raise JobError (one line) when there is no GPU and no CPU fallback was asked for."""
        if self._on_gpu is None:
            self._on_gpu = use_cuda(f"decode='{self.spec}{CUDA_SUFFIX}'", fallback=self.fallback)

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        result = self.decode_batch([sample])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def decode_batch(self, samples: Sequence[dict[str, Any]]) -> list[Any]:
        """One decoded sample per input, or the exception that sample's decode raised."""
        self.check()
        if not self._on_gpu:
            return [_try(self.cpu, s) for s in samples]
        import torch

        out: list[Any] = []
        jpegs: list[tuple[int, str, bytes]] = []  # (sample, entry, bytes) decoded on the GPU together
        for i, sample in enumerate(samples):
            rest = {k: v for k, v in sample.items() if not (k in _JPEG and isinstance(v, (bytes, bytearray)))}
            decoded = _try(self.cpu, rest)
            out.append(decoded)
            if not isinstance(decoded, Exception):
                jpegs.extend((i, k, bytes(sample[k])) for k in sample if k not in rest)
                _to_device(decoded, self.device)
        views = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for _, _, data in jpegs]
        for (i, ext, _), image in zip(jpegs, decode_jpegs(views, self.device)):
            if isinstance(out[i], Exception):
                continue
            if isinstance(image, Exception):
                out[i] = _located(image, ext, samples[i])
            else:
                out[i][ext] = to_spec(image, self.spec)
        return out


def _located(error: Exception, ext: str, sample: dict[str, Any]) -> ShardflowError:
    """An image's decode failure as its sample's DecodeError (logged with shard and key)."""
    url, key = sample.get("__url__"), sample.get("__key__")
    if isinstance(error, ShardflowError):
        return error.with_location(url=url, key=key)
    return DecodeError(f"cannot decode {ext!r}: {error}", url=url, key=key)


def _to_device(sample: dict[str, Any], device: str) -> None:
    """Images the CPU decoded (PNG, ...) join the JPEGs on the GPU."""
    for k, v in sample.items():
        if not k.startswith("__") and is_tensor(v) and v.ndim in (2, 3):
            sample[k] = v.to(device, non_blocking=True)


def _try(decoder: Callable[[dict[str, Any]], dict[str, Any]], sample: dict[str, Any]) -> Any:
    try:
        return decoder(sample)
    except Exception as exc:  # noqa: BLE001 - this sample's decode failure, logged with its key
        return exc


def encode_on_device(samples: list[dict[str, Any]], quality: int) -> list[dict[str, Any]]:
    """JPEG entries holding CUDA CHW images -> JPEG bytes encoded on the GPU (one batched call).

    Floats are taken as [0, 1] and rounded to uint8 like the CPU encoder does. Samples without CUDA
    tensors come back as they are (no torch import when torch was never imported).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return samples
    where = [(i, k) for i, s in enumerate(samples) for k, v in s.items()
             if k in _JPEG and is_tensor(v) and v.is_cuda and v.ndim == 3 and v.shape[0] in (1, 3)]
    if not where:
        return samples
    import torchvision.io as tvio

    images = [_uint8(samples[i][k], torch) for i, k in where]
    encoded = tvio.encode_jpeg(images, quality=quality)
    out = [dict(s) for s in samples]
    for (i, k), data in zip(where, encoded):
        out[i][k] = data.cpu().numpy().tobytes()
    return out


def _uint8(image: Any, torch: Any) -> Any:
    """Float [0, 1] -> uint8 on the tensor's device, with the CPU encoder's rule: rounding, NaN -> 0, and
    values outside [0, 1] beyond half a grey level refused (a forgotten /255 is an error, not white)."""
    if image.dtype == torch.uint8:
        return image.contiguous()
    work = image.float()
    finite = work.nan_to_num(0.5)
    if finite.numel() and (finite.amin().item() < -FLOAT_TOLERANCE or finite.amax().item() > 1 + FLOAT_TOLERANCE):
        _check_float_range(work.detach().cpu().numpy())  # raises, with the CPU encoder's message
    return work.mul(255).round_().nan_to_num_(0).clamp_(0, 255).to(torch.uint8).contiguous()
