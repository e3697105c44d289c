"""The reader's side of GPU JPEG decode: the batches a Loader returns, decoded in the main process.

Workers leave JPEGs encoded (PackedJpegs: one tensor per batch), so what crosses the process
boundary is the compressed bytes; the main process decodes a whole batch in one call on the device.
The spec table, the `-cuda` suffix and the fallback rule (nvjpeg per batch, then per image, the CPU
codec for what nvjpeg refuses) belong to `shardflow.codecs.gpu`, shared with jobs; this module only
maps them over the reader's placeholders (reader/values.py) and stacks the images into a batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardflow.codecs.gpu import decode_jpegs, to_spec
from shardflow.errors import DecodeError
from shardflow.reader.values import HWCImage, PackedJpegs, RawJpeg, map_placeholders, pack_jpegs


@dataclass(frozen=True)
class GpuDecoder:
    """Decodes the JPEGs a worker left encoded; other values pass through."""

    spec: str  # one of codecs.gpu.GPU_SPECS
    device: str | torch.device
    channels_last: bool = False
    allow_pickle: bool = False  # kept for callers that pass it: JPEG decode never unpickles

    def __call__(self, item: Any) -> Any:
        return map_placeholders(item, self._decode)

    def _decode(self, value: Any) -> Any:
        if isinstance(value, HWCImage):
            return value.tensor()
        if isinstance(value, RawJpeg):
            value = pack_jpegs([value], single=True)
        images = self._decode_views(value)
        if value.single:
            return to_spec(images[0], self.spec)
        if all(i.shape == images[0].shape for i in images):
            out = torch.stack(images)
            if self.channels_last:
                out = out.contiguous(memory_format=torch.channels_last)
            return to_spec(out, self.spec)  # one conversion for the batch
        return [to_spec(i, self.spec) for i in images]

    def _decode_views(self, value: PackedJpegs) -> list[torch.Tensor]:
        """uint8 CHW RGB images on the device, one per JPEG; an image no decoder reads raises here (the
        batch is already formed, so the reader's on_error cannot drop that one sample any more)."""
        images = decode_jpegs(value.views(), torch.device(self.device))
        for index, image in enumerate(images):
            if isinstance(image, Exception):
                raise DecodeError(f"GPU decode: JPEG {index} of the batch cannot be decoded: {image}") from image
        return images
