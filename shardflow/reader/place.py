"""JPEGs decoded straight into their row of the batch tensor ("placed"): no fresh array per image.

A decoded 256x256 image is 196 KB. Decoding it into a fresh array costs page faults (expensive,
worst in VMs) and then a copy into the batch; at that size this is a fifth of the decode itself.
So with the default collate and a torch uint8 RGB spec the preparer asks an ImagePlacer to decode
the batch's main JPEG field into the row its sample will take (samples are batched in order, so
that row is the number of samples the batch holds so far). Channels-last batches take simplejpeg's
HWC output as it is; CHW batches decode into one reused HWC scratch array, split into the row's
channel planes from there (codecs.planes).
The batch tensor is a ring buffer under a Loader (see shm.py). Anything unusual (another size, a
JPEG simplejpeg refuses, no simplejpeg) is decoded as before, and collate copies it into its row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shardflow.codecs.images import decode_jpeg_into, jpeg_size
from shardflow.codecs.planes import to_planes
from shardflow.reader.shm import Ring, shared_empty


class BatchBuffer:
    """The tensor one batch's placed images go to: (B, C, H, W), or (B, H, W, C) for channels-last."""

    __slots__ = ("tensor", "pixels", "hw", "hwc", "slot", "ring", "claimed")

    def __init__(self, tensor: torch.Tensor, hw: tuple[int, int], hwc: bool, slot: int | None,
                 ring: Ring | None) -> None:
        self.tensor = tensor
        self.pixels = tensor.numpy()
        self.hw = hw
        self.hwc = hwc  # channels-last rows (else C, H, W)
        self.slot = slot  # the ring slot it is (None: a tensor of its own)
        self.ring = ring
        self.claimed = False  # collate made it (part of) a batch: never written again

    def claim(self, field: Any) -> None:
        """It becomes field `field` of the batch being sent (the ring learns which field it is)."""
        self.claimed = True
        if self.ring is not None and self.slot is not None:
            self.ring.record(self.slot, field)

    def release(self) -> None:
        """Not used after all (collate fell back to a batch of its own): the slot is free again."""
        self.claimed = True
        if self.ring is not None and self.slot is not None:
            self.ring.release(self.slot)


class PlacedImage:
    """A decoded image that already sits in row `row` of `buffer`."""

    __slots__ = ("buffer", "row")

    def __init__(self, buffer: BatchBuffer, row: int) -> None:
        self.buffer = buffer
        self.row = row

    def hwc(self) -> np.ndarray:
        """A copy of the image as an HWC array of its own (for batches collate builds itself)."""
        a = self.buffer.pixels[self.row]
        return (a if self.buffer.hwc else a.transpose(1, 2, 0)).copy()


class ImagePlacer:
    """Decodes one JPEG field per sample into the rows of the batch being built."""

    def __init__(self, batch_size: int, channels_last: bool, shared: bool, ring: Ring | None) -> None:
        self.batch_size = batch_size
        self.channels_last = channels_last
        self.shared = shared
        self.ring = ring
        self.key: str | None = None  # the field placed (the first JPEG field seen)
        self.row = 0  # samples in the batch being built: the row the next one takes (set by the stream)
        self.buffer: BatchBuffer | None = None
        self.scratch: np.ndarray | None = None  # HWC decode target for CHW batches
        self.sizes_match = True  # no image so far differed in size from its batch's first

    def close(self) -> None:
        """The epoch is over: a buffer no batch claimed (its samples dropped) goes back to the ring."""
        if self.buffer is not None and not self.buffer.claimed:
            self.buffer.release()
        self.buffer = None

    def place(self, key: str, data: Any) -> PlacedImage | None:
        """`data` (a JPEG) decoded into the current row; None: decode it the usual way instead."""
        if self.key is None:
            self.key = key
        elif key != self.key or self.row >= self.batch_size:
            return None
        row, buffer = self.row, self.buffer
        if row > 0 and self.sizes_match and buffer is not None and not buffer.claimed:
            # The batch's buffer bounds the image, so no header is read first (it costs ~1 %).
            if self._decode(data, buffer, row):
                return PlacedImage(buffer, row)
            hw = jpeg_size(data)
            if hw is not None and hw != buffer.hw:
                self.sizes_match = False  # images of several sizes: read each header from now on
            return None
        hw = jpeg_size(data)
        if hw is None:
            return None
        buffer = self._buffer(hw)
        if buffer is None:
            return None
        return PlacedImage(buffer, row) if self._decode(data, buffer, row) else None

    def _decode(self, data: Any, buffer: BatchBuffer, row: int) -> bool:
        """Decode into row `row` of `buffer`; False (the row may hold part of it) when the JPEG is
        not an RGB image of the buffer's size that simplejpeg decodes."""
        if self.channels_last:
            return decode_jpeg_into(data, buffer.pixels[row])
        if self.scratch is None or self.scratch.shape[:2] != buffer.hw:
            self.scratch = np.empty((*buffer.hw, 3), np.uint8)
        if not decode_jpeg_into(data, self.scratch):
            return False
        to_planes(self.scratch, buffer.pixels[row])
        return True

    def _buffer(self, hw: tuple[int, int]) -> BatchBuffer | None:
        """The buffer of the batch being built; a new one for its first row (or a first image of
        another size). None: this image does not fit the batch's buffer (collate copies it)."""
        buffer = self.buffer
        fresh = buffer is None or buffer.claimed
        if self.row > 0:
            return None if fresh or buffer.hw != hw else buffer  # type: ignore[union-attr]
        if not fresh and buffer.hw == hw:  # type: ignore[union-attr]
            return buffer  # the first sample before was dropped after decoding: its row is free
        if not fresh:
            buffer.release()  # type: ignore[union-attr]
        self.buffer = buffer = self._new(hw)
        return buffer

    def _new(self, hw: tuple[int, int]) -> BatchBuffer:
        h, w = hw
        shape = (h, w, 3) if self.channels_last else (3, h, w)
        got = self.ring.acquire(shape, torch.uint8) if self.ring is not None else None
        if got is not None:
            slot, tensor = got
            return BatchBuffer(tensor, hw, self.channels_last, slot, self.ring)
        tensor = shared_empty((self.batch_size, *shape), torch.uint8, self.shared)
        return BatchBuffer(tensor, hw, self.channels_last, None, None)
