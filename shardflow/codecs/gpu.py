"""GPU codecs for jobs: nvjpeg decode of whole batches, JPEG encode of CUDA tensors on the GPU.

`decode="torchrgb8-cuda"` (or `torchrgb-cuda`, `torch-cuda`: float in [0, 1]) decodes the JPEGs of
a batch in one `torchvision.io.decode_jpeg(list, device="cuda")` call; a JPEG nvjpeg refuses (CMYK,
progressive on old drivers, damaged) and every other image (PNG, WebP...) is decoded on the CPU by
the same spec without the suffix and moved to the GPU, so each sample gets its images on the device.
Other entries decode as the CPU spec says. Without CUDA the job fails with one line, unless the
job's device is "auto": then everything decodes on the CPU (same values, on the CPU).

`encode_on_device` writes JPEG entries holding CUDA image tensors with `torchvision.io.encode_jpeg`
on the GPU (one call per batch); everything else is left to the Encoder (CPU: PNG stays there).
GPU JPEG bytes differ from Pillow's: a GPU job's outputs are reproducible on the same GPU type and
driver, not across CPU and GPU.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from shardflow.codecs.decoder import Decoder
from shardflow.codecs.images import FLOAT_TOLERANCE, _check_float_range
from shardflow.codecs.tensors import is_tensor
from shardflow.errors import DecodeError, JobError

CUDA_SUFFIX = "-cuda"
ALIASES = ("-gpu",)  # the reader's spelling (decode="torchrgb8-gpu") means the same in jobs
GPU_SPECS = {"torchrgb8": False, "torchrgb": True, "torch": True}  # spec -> scaled to float [0, 1]
_JPEG = ("jpg", "jpeg")


def make_decoder(spec: str, *, allow_pickle: bool = False, device: str | None = None) -> Callable[..., Any]:
    """The decoder of a job's `decode` setting: a CPU Decoder, or a GpuJpegDecoder for `<spec>-cuda`."""
    suffix = next((s for s in (CUDA_SUFFIX, *ALIASES) if spec.endswith(s)), None)
    if suffix is None:
        return Decoder(spec, allow_pickle=allow_pickle)
    base = spec[: -len(suffix)]
    if base not in GPU_SPECS:
        names = ", ".join(name + CUDA_SUFFIX for name in GPU_SPECS)
        raise ValueError(f"decode={spec!r}: GPU decode gives {names}")
    return GpuJpegDecoder(base, Decoder(base, allow_pickle=allow_pickle), fallback=device == "auto")


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


class GpuJpegDecoder:
    """Decodes samples with their JPEGs on the GPU (a batch at a time), the rest by `cpu`."""

    def __init__(self, spec: str, cpu: Decoder, *, fallback: bool = False) -> None:
        self.spec, self.cpu, self.fallback = spec, cpu, fallback
        self._on_gpu: bool | None = None  # decided on this worker, on first use
        self.device = "cuda"  # where decoded images go ("cpu" in tests: the same batching and fallbacks)
        self._cpu_jpeg = Decoder("torchrgb8", only="jpg")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_on_gpu": None}  # the driver's answer is not the worker's

    def check(self) -> None:
        """Raise JobError (one line) when there is no GPU and no CPU fallback was asked for."""
        if self._on_gpu is None:
            self._on_gpu = cuda_available()
        if not self._on_gpu and not self.fallback:
            raise JobError(no_cuda_message(f"decode='{self.spec}{CUDA_SUFFIX}'"))

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
        out: list[Any] = []
        jpegs: list[tuple[int, str, bytes]] = []  # (sample, entry, bytes) decoded on the GPU together
        for i, sample in enumerate(samples):
            rest = {k: v for k, v in sample.items() if not (k in _JPEG and isinstance(v, (bytes, bytearray)))}
            decoded = _try(self.cpu, rest)
            out.append(decoded)
            if not isinstance(decoded, Exception):
                jpegs.extend((i, k, bytes(sample[k])) for k in sample if k not in rest)
                _to_device(decoded, self.device)
        for (i, ext, _), image in zip(jpegs, self._decode_jpegs([d for _, _, d in jpegs])):
            if isinstance(out[i], Exception):
                continue
            if isinstance(image, Exception):
                out[i] = DecodeError(f"cannot decode {ext!r}: {image}", url=samples[i].get("__url__"),
                                     key=samples[i].get("__key__"))
            else:
                out[i][ext] = image.float().div_(255) if GPU_SPECS[self.spec] else image
        return out

    def _decode_jpegs(self, datas: list[bytes]) -> list[Any]:
        """uint8 CHW RGB CUDA tensors (or the exception) for each JPEG; nvjpeg first, CPU for the refused."""
        if not datas:
            return []
        import torch
        import torchvision.io as tvio

        views = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        try:
            return list(tvio.decode_jpeg(views, mode=tvio.ImageReadMode.RGB, device=self.device))
        except Exception:  # noqa: BLE001 - one refused JPEG fails the batch call: decode one by one
            return [self._one(view, data) for view, data in zip(views, datas)]

    def _one(self, view: Any, data: bytes) -> Any:
        import torchvision.io as tvio

        try:
            return tvio.decode_jpeg(view, mode=tvio.ImageReadMode.RGB, device=self.device)
        except Exception:  # noqa: BLE001 - CMYK & co: the CPU decodes it (Pillow), then to the GPU
            try:
                return self._cpu_jpeg({"jpg": data})["jpg"].to(self.device)
            except Exception as exc:  # noqa: BLE001
                return exc


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
