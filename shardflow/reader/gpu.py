"""GPU JPEG decode (torchvision's nvjpeg path) in the main process, with a CPU fallback.

Workers leave JPEGs encoded (PackedJpegs: one tensor per batch), so what crosses the process
boundary is the compressed bytes; the main process decodes a whole batch in one call on the device.
A JPEG nvjpeg refuses (CMYK, ...) or a machine without nvjpeg decodes on the CPU instead, with the
same codec the CPU path uses, and says so once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardflow.codecs import decode_value
from shardflow.reader.values import HWCImage, PackedJpegs, RawJpeg, map_placeholders, pack_jpegs
from shardflow.reader.warn_once import warn_once

GPU_SUFFIX = "-gpu"  # decode="torchrgb8-gpu" asks for GPU decode
# the decode specs the GPU decoder can produce: value = scale to float [0, 1]
GPU_SPECS = {"torchrgb8": False, "torchrgb": True, "torch": True}


@dataclass(frozen=True)
class GpuDecoder:
    """Decodes the JPEGs a worker left encoded; other values pass through."""

    spec: str  # one of GPU_SPECS
    device: str | torch.device
    channels_last: bool = False
    allow_pickle: bool = False

    def __call__(self, item: Any) -> Any:
        return map_placeholders(item, self._decode)

    def _decode(self, value: Any) -> Any:
        if isinstance(value, HWCImage):
            return value.tensor()
        if isinstance(value, RawJpeg):
            value = pack_jpegs([value], single=True)
        images = self._decode_views(value)
        scale = GPU_SPECS[self.spec]
        if value.single:
            img = images[0]
            return img.float().div_(255) if scale else img
        if all(i.shape == images[0].shape for i in images):
            out = torch.stack(images)
            if self.channels_last:
                out = out.contiguous(memory_format=torch.channels_last)
            return out.float().div_(255) if scale else out
        return [i.float().div_(255) if scale else i for i in images]

    def _decode_views(self, value: PackedJpegs) -> list[torch.Tensor]:
        """uint8 CHW RGB images on the device, one per JPEG."""
        views = value.views()
        device = torch.device(self.device)
        try:
            import torchvision.io as tvio

            return tvio.decode_jpeg(views, mode=tvio.ImageReadMode.RGB, device=device)
        except Exception as exc:  # unsupported JPEG (CMYK, ...), no nvjpeg: decode on the CPU
            warn_once(f"GPU JPEG decode failed ({type(exc).__name__}: {exc}); decoding those batches on the CPU")
            return [decode_value("jpg", v.numpy().tobytes(), "torchrgb8", self.allow_pickle).to(device) for v in views]
