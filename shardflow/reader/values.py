"""Values a sample carries between decoding and the batch: placeholders the batch stage resolves.

The reader does not always turn an image into its final tensor at once: a decoded HWC array is kept
as it is until collate writes it straight into the batch tensor (one copy), and a JPEG meant for the
GPU stays encoded until the main process decodes a whole batch of them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import torch


class PackedJpegs(NamedTuple):
    """JPEG bytes of a batch, still encoded (GPU decode happens in the main process, see Loader).

    `data` holds all images back to back; image i is data[offsets[i]:offsets[i + 1]]. One tensor
    instead of one per image keeps the cost of crossing from a worker process small.
    """

    data: torch.Tensor
    offsets: torch.Tensor
    single: bool  # an unbatched sample: decodes to one image, not a batch

    def views(self) -> list[torch.Tensor]:
        o = self.offsets.tolist()
        return [self.data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


class HWCImage:
    """A decoded uint8 image (numpy HWC or HW) still to be placed into a CHW torch batch."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def tensor(self) -> torch.Tensor:
        """What the codec's torch spec would have returned for this image."""
        a = self.a
        if a.ndim == 3:
            a = np.ascontiguousarray(a.transpose(2, 0, 1))
        elif not a.flags.writeable:
            a = a.copy()
        return torch.from_numpy(a)


class RawJpeg:
    """JPEG bytes left for the GPU decoder."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def pack_jpegs(values: list[RawJpeg], single: bool) -> PackedJpegs:
    """The JPEGs of `values` back to back in one tensor (see PackedJpegs)."""
    sizes = [len(v.data) for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = torch.from_numpy(np.frombuffer(b"".join(v.data for v in values), dtype=np.uint8).copy())
    return PackedJpegs(data, torch.from_numpy(offsets), single)


def map_placeholders(value: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply fn to the placeholders (PackedJpegs, HWCImage, RawJpeg) inside dicts, tuples and lists."""
    if isinstance(value, (PackedJpegs, HWCImage, RawJpeg)):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_placeholders(v, fn) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map_placeholders(v, fn) for v in value)
    if isinstance(value, list):
        return [map_placeholders(v, fn) for v in value]
    return value


def pack_unbatched(sample: Any) -> Any:
    """An unbatched sample for the GPU path: each raw JPEG packed alone (it never meets a collate)."""
    return map_placeholders(sample, lambda v: pack_jpegs([v], single=True) if isinstance(v, RawJpeg) else v)
