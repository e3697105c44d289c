"""Zero-copy batches under a Loader: image batches in reused shared-memory buffers ("the ring").

Sending a tensor from a DataLoader worker normally costs a fresh shared-memory segment per batch
(create, zero-fill every page on first touch, unmap), which at 256x256 costs about as much as the
JPEG decoding itself. So under a Loader each worker writes its image batches into a few buffers
allocated once (`Ring`), sends a buffer the main process already maps as a small reference
(`SlotRef`), and the main process hands a buffer back (`RingReturns`) once no tensor refers to it.
Small tensors go inline (pickled bytes): a segment and a file descriptor per tensor cost more.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

# (slot, field) pairs: the ring slots an item's fields were written into (field None: the item itself)
UsedSlots = tuple[tuple[int, Any], ...]

INLINE_LIMIT = 1 << 16  # bytes: smaller tensors of a batch travel inline


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """A new tensor; in a DataLoader worker, in shared memory so sending it costs no extra copy."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    proto = torch.empty(0, dtype=dtype)
    numel = 1
    for n in shape:
        numel *= n
    storage = proto._typed_storage()._new_shared(numel, device=proto.device)
    return proto.new(storage).view(shape)


class SlotRef(NamedTuple):
    """A view of a ring slot the Loader already has mapped: sent instead of the tensor."""

    slot: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class Ring:
    """Image batch buffers in shared memory that a worker reuses once nobody holds them any more.

    A worker writes image batches into one of `slots` buffers, allocated once; the Loader marks a
    slot free again in `free` (a shared array, one flag per slot of every worker) once no tensor in
    the main process refers to that buffer any more (the batch and all views of it are gone: its
    storage's use count says so). A worker that finds no free slot allocates a fresh buffer instead,
    so it never waits, and a buffer is never written while anything can still read it.
    """

    def __init__(self, free: Any, slots: int, worker: int, batch_size: int, refs: bool = True) -> None:
        self.free = free
        self.slots = slots
        self.base = worker * slots
        self.batch_size = batch_size
        self.key: tuple | None = None
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.used: list[tuple[int, Any]] = []
        self.sent: set[int] = set()  # slots the Loader has mapped (it keeps them mapped all epoch)
        self.refs = refs  # send later uses of a slot as a SlotRef (no fd passing); off with pin_memory

    def take(self, n: int, shape: tuple[int, ...], dtype: torch.dtype, field: Any) -> torch.Tensor | None:
        """A buffer for `n` images of `shape` (recorded as used by `field`), or None (use a fresh one)."""
        got = self.acquire(shape, dtype) if n <= self.batch_size else None
        if got is None:
            return None
        slot, buf = got
        self.record(slot, field)
        return buf[:n]

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, torch.Tensor] | None:
        """(slot, its buffer of batch_size images of `shape`), or None (use a fresh tensor). The
        slot is ours until `record` sends it or `release` gives it back."""
        if self.key is None:
            self.key = (shape, dtype)
        elif self.key != (shape, dtype):
            return None  # one ring per worker, for the main image field
        with self.free.get_lock():
            for slot in range(self.slots):  # the lowest free slot: a consumer that keeps up touches few
                if self.free[self.base + slot]:
                    self.free[self.base + slot] = 0
                    break
            else:
                return None
        buf = self.buffers[slot]
        if buf is None:  # allocated when first needed: a consumer that keeps up uses only a few
            buf = self.buffers[slot] = shared_empty((self.batch_size, *shape), dtype, True)
        return slot, buf

    def record(self, slot: int, field: Any) -> None:
        """Slot `slot` holds field `field` of the item about to be sent."""
        self.used.append((slot, field))

    def release(self, slot: int) -> None:
        """Give back a slot that was acquired and not sent after all."""
        with self.free.get_lock():
            self.free[self.base + slot] = 1

    def pop_used(self) -> UsedSlots:
        used, self.used = tuple(self.used), []
        return used

    def outgoing(self, item: Any) -> tuple[Any, UsedSlots]:
        """The item as it is sent (slots the Loader already maps become references) and its slots."""
        used = self.pop_used()
        if not self.refs:
            return item, used
        for slot, field in used:
            if slot in self.sent:
                value = item if field is None else item[field]
                ref = SlotRef(slot, tuple(value.shape), tuple(value.stride()), value.storage_offset())
                item = replace_field(item, field, ref)
            else:
                self.sent.add(slot)
        return item, used


class RingConfig(NamedTuple):
    """What a Loader hands its dataset copy so the workers can build their rings."""

    flags: Any  # a shared array of "free" flags, `slots` per worker
    slots: int
    refs: bool  # send slots already mapped as SlotRefs (False under pin_memory: the pinned copy arrives)

    @classmethod
    def create(cls, num_workers: int, prefetch_factor: int | None, pinning: bool, context: Any) -> RingConfig:
        """Flags for `num_workers` rings in the Loader's multiprocessing `context` (name or object)."""
        ctx = context or torch.multiprocessing.get_context()
        if isinstance(ctx, str):
            ctx = torch.multiprocessing.get_context(ctx)
        slots = (prefetch_factor or 2) + 3  # in flight + the batch you hold + the one before
        return cls(ctx.Array("b", [1] * (num_workers * slots)), slots, not pinning)

    def ring(self, worker: int, batch_size: int) -> Ring:
        return Ring(self.flags, self.slots, worker, batch_size, self.refs)


class InlineArray:
    """A small tensor sent inline (pickled bytes) rather than through a shared-memory segment."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a


def _map_fields(item: Any, fn: Any) -> Any:
    if isinstance(item, dict):
        return {k: fn(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(fn(v) for v in item)
    return fn(item)


def inline_small(item: Any, limit: int = INLINE_LIMIT) -> Any:
    """Under a Loader, small tensors of a batch go inline: a segment + fd per tensor costs more."""

    def small(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and not v.is_shared() and v.device.type == "cpu" \
                and v.numel() * v.element_size() <= limit and v.dtype != torch.bfloat16:
            return InlineArray(v.numpy())
        return v

    return _map_fields(item, small)


def unwrap_small(item: Any, pin: bool) -> Any:
    """The tensors `inline_small` packed, back as tensors (pinned when the Loader pins memory)."""

    def unwrap(v: Any) -> Any:
        if isinstance(v, InlineArray):
            t = torch.from_numpy(v.a)
            return t.pin_memory() if pin else t
        return v

    return _map_fields(item, unwrap)


def outgoing(item: Any, ring: Ring | None) -> tuple[Any, UsedSlots]:
    """A batch as a Loader's worker sends it: ring slots as references, small tensors inline."""
    if ring is None:
        return item, ()
    item, used = ring.outgoing(item)
    return inline_small(item), used


def replace_field(item: Any, field: Any, value: Any) -> Any:
    """`item` with `field` (a dict key, a tuple index, or None for the item itself) set to `value`."""
    if field is None:
        return value
    if isinstance(item, tuple):
        return item[:field] + (value,) + item[field + 1:]
    item[field] = value
    return item


class RingReturns:
    """The Loader's side of the workers' rings: which slots the batches it returned still hold."""

    def __init__(self, config: RingConfig) -> None:
        self.free = config.flags
        self.slots = config.slots
        self.mapped: dict[tuple[int, int], Any] = {}  # (worker, slot) -> (storage, dtype), mapped all epoch
        self.pending: set[tuple[int, int]] = set()

    def accept(self, item: Any, worker: int, used: UsedSlots, pin: bool) -> Any:
        """A batch as the user gets it: slot references resolved, inline tensors unwrapped; then
        every slot nobody refers to any more goes back to its worker."""
        if used:
            item = self.received(item, worker, used)
        item = unwrap_small(item, pin)
        self.collect()
        return item

    def received(self, item: Any, worker: int, used: UsedSlots) -> Any:
        """The item with slot references resolved; records which slots it holds."""
        done = []
        for slot, field in used:
            key = (worker, slot)
            value = item if field is None else item[field]
            if isinstance(value, SlotRef):
                storage, dtype = self.mapped[key]
                value = torch.empty(0, dtype=dtype).set_(storage, value.offset, value.shape, value.stride)
                item = replace_field(item, field, value)
            if isinstance(value, torch.Tensor) and value.is_shared():
                self.mapped[key] = (value.untyped_storage(), value.dtype)
                self.pending.add(key)
            else:  # pin_memory made a copy: the buffer is already free
                done.append(key)
        self._free(done)
        return item

    def collect(self) -> None:
        """Hand back every slot whose buffer only our own reference still points to."""
        done = [ws for ws in self.pending if torch._C._storage_Use_Count(self.mapped[ws][0]._cdata) <= 1]
        self.pending.difference_update(done)
        self._free(done)

    def _free(self, slots: list[tuple[int, int]]) -> None:
        if slots:
            with self.free.get_lock():
                for worker, slot in slots:
                    self.free[worker * self.slots + slot] = 1
