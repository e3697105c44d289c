"""Batches from samples: one column per field, stacked where the values allow it.

Decoded images (HWCImage) are written straight into the batch tensor, transposed to CHW on the way
(or copied as they are for channels-last batches), so a batch costs one copy of its pixels; JPEGs
the preparer already decoded into their rows (PlacedImage, see place.py) cost none here. Under a
Loader that tensor is a reused shared-memory buffer of the worker's ring (see shm.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shardflow.codecs.planes import to_planes
from shardflow.reader.place import PlacedImage
from shardflow.reader.shm import Ring, shared_empty
from shardflow.reader.values import HWCImage, RawJpeg, pack_jpegs

SHARED_MIN_BYTES = 1 << 16  # smaller stacked tensors are not worth a shared-memory segment


def collate(samples: list[Any], shared: bool = False, channels_last: bool = False, ring: Ring | None = None) -> Any:
    """A batch from samples: dicts -> dict of columns, tuples -> tuple of columns.

    Tensors (and numpy arrays) of one shape and dtype are stacked, numbers become a tensor, anything
    else (strings, keys, ragged images) a list. `shared`: allocate in shared memory (in a worker).
    """
    first = samples[0]
    if isinstance(first, dict):
        keys = list(first)
        for s in samples[1:]:
            if len(s) != len(keys) or any(k not in s for k in keys):
                keys = list(dict.fromkeys(k for s2 in samples for k in s2))
                break
        return {k: collate_column([s.get(k) for s in samples], shared, channels_last, ring, k) for k in keys}
    if isinstance(first, tuple):
        return tuple(collate_column(list(col), shared, channels_last, ring, i) for i, col in enumerate(zip(*samples)))
    return collate_column(samples, shared, channels_last, ring)


def collate_column(
    values: list[Any], shared: bool, channels_last: bool = False, ring: Ring | None = None, field: Any = None
) -> Any:
    """One field of a batch (`field` names it for the ring: a dict key, a tuple index or None)."""
    if isinstance(values[0], (HWCImage, PlacedImage)):
        out, values = _placed_batch(values, channels_last, field)
        if out is not None:
            return out
        out = _stack_images(values, shared, channels_last, ring, field)
        if out is not None:
            return out
        values = [v.tensor() if isinstance(v, HWCImage) else v for v in values]
    first = values[0]
    if isinstance(first, RawJpeg) and all(isinstance(v, RawJpeg) for v in values):
        return pack_jpegs(values, single=False)
    if any(isinstance(v, RawJpeg) for v in values):  # JPEG and other images under one field
        return [pack_jpegs([v], single=True) if isinstance(v, RawJpeg) else v for v in values]
    if isinstance(first, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            big = shared and len(values) * first.numel() * first.element_size() >= SHARED_MIN_BYTES
            out = shared_empty((len(values), *first.shape), first.dtype, big) if first.device.type == "cpu" else None
            return torch.stack(values, 0, out=out)
        return list(values)
    if isinstance(first, np.ndarray) and first.dtype != object:
        if all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
        return list(values)
    if isinstance(first, (bool, int, float, np.number, np.bool_)) and not isinstance(first, str):
        kinds = {type(v) for v in values}
        if len(kinds) == 1:
            return torch.as_tensor(np.asarray(values))
    return list(values)


def _placed_batch(values: list[Any], channels_last: bool, field: Any) -> tuple[torch.Tensor | None, list[Any]]:
    """(the batch tensor the preparer decoded these images into, values): images it could not place
    are copied into their rows. (None, values) when none is placed; (None, values with the placed
    ones copied out) when sizes differ: the buffer is then given back."""
    placed = next((v for v in values if isinstance(v, PlacedImage)), None)
    if placed is None:
        return None, values
    buffer = placed.buffer
    pixels = buffer.pixels
    fits = not buffer.claimed and len(values) <= len(pixels)
    for i, v in enumerate(values):
        if not fits:
            break
        if isinstance(v, PlacedImage):
            fits = v.buffer is buffer and v.row == i
        else:
            fits = isinstance(v, HWCImage) and v.a.dtype == np.uint8 and v.a.shape == (*buffer.hw, 3)
            if fits:
                if channels_last:
                    pixels[i] = v.a
                else:
                    to_planes(v.a, pixels[i])
    if not fits:
        values = [HWCImage(v.hwc()) if isinstance(v, PlacedImage) else v for v in values]
        if not buffer.claimed:
            buffer.release()
        return None, values
    buffer.claim(field)
    out = buffer.tensor[: len(values)]
    return (out.permute(0, 3, 1, 2) if channels_last else out), values


def _stack_images(
    values: list[Any], shared: bool, channels_last: bool, ring: Ring | None, field: Any
) -> torch.Tensor | None:
    """Decoded images of one shape and dtype as a (B, C, H, W) uint8 batch; None when they differ."""
    first = values[0]
    if not all(isinstance(v, HWCImage) for v in values):
        return None
    shape, dtype = first.a.shape, first.a.dtype
    if not all(v.a.shape == shape and v.a.dtype == dtype for v in values):
        return None
    tdtype = torch.from_numpy(first.a[:0]).dtype
    n = len(values)
    if first.a.ndim == 3 and channels_last:  # plain copies, no transposition
        out = _image_batch(n, shape, tdtype, shared, ring, field)
        o = out.numpy()
        for i, v in enumerate(values):
            o[i] = v.a
        return out.permute(0, 3, 1, 2)
    if first.a.ndim == 3:
        h, w, c = shape
        out = _image_batch(n, (c, h, w), tdtype, shared, ring, field)
        o = out.numpy()
        for i, v in enumerate(values):
            to_planes(v.a, o[i])
    else:
        out = _image_batch(n, shape, tdtype, shared, ring, field)
        o = out.numpy()
        for i, v in enumerate(values):
            o[i] = v.a
    return out


def _image_batch(
    n: int, shape: tuple[int, ...], dtype: torch.dtype, shared: bool, ring: Ring | None, field: Any
) -> torch.Tensor:
    """A tensor for `n` images: a ring buffer when one is free, else a new (shared) tensor."""
    out = ring.take(n, shape, dtype, field) if ring is not None else None
    return out if out is not None else shared_empty((n, *shape), dtype, shared)
