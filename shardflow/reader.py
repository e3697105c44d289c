"""ShardDataset: the training reader (a PyTorch IterableDataset), and Loader, its DataLoader.

    ds = sf.ShardDataset("s3://b/train-{000000..000554}.tar", decode="torchrgb8", shuffle=1000,
                         batch_size=64, seed=0, equalize="drop")
    loader = sf.Loader(ds, num_workers=8)          # or DataLoader(ds, batch_size=None, num_workers=8)
    for epoch in range(start, epochs):
        for batch in loader: ...                   # batch["jpg"]: uint8 (64, 3, H, W); batch["__key__"]: list
        torch.save({"loader": loader.state_dict(), ...})   # any time, mid-epoch too

Per consumer (one DataLoader worker of one rank) the pipeline is:
    its samples (see split.py) -> shuffle buffer of RAW samples -> decode -> map -> to_tuple -> batch
Raw samples are shuffled, so the buffer holds compressed bytes, and skipping (resume) never decodes.
Images of torch uint8 specs are decoded to HWC arrays (simplejpeg, through codecs) and written once,
straight into the batch tensor; under a Loader that tensor lives in a reused shared-memory buffer, so
a batch costs no fresh shared-memory segment and no extra copy on its way to the main process.

Guarantees (the long version: Loader's docstring):
- one epoch = every sample exactly once over all ranks and workers (unless equalize/epoch_size ask for
  fixed counts; resampled=True draws shards with replacement instead);
- the order is a function of (seed, epoch, rank, worker) only, through integer hashing;
- `Loader.state_dict()` taken after the n-th batch, loaded into a new Loader (same shards, seed,
  world size and num_workers), yields exactly the batches the first one had not yet returned.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import warnings
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import urls as _urls
from .cache import ShardCache
from .codecs import IMAGE_EXTENSIONS, IMAGE_SPECS, Decoder, decode_value
from .errors import DecodeError, SampleError, ShardflowError, ShardIOError, SkipSample
from .samples import ON_ERROR, read_samples
from .split import (
    EQUALIZE,
    TAG_BUFFER,
    TAG_RESAMPLE,
    Assignment,
    Consumer,
    Segment,
    assign,
    rank_length,
    resampled_shards,
    rng_for,
)

try:
    from .samples import ShardflowWarning
except ImportError:  # pragma: no cover
    class ShardflowWarning(UserWarning):
        pass


__all__ = ["ShardDataset", "Loader", "PackedJpegs", "collate", "STATE_VERSION"]

STATE_VERSION = 1
DEFAULT_SHUFFLE = 1000
GPU_SUFFIX = "-gpu"
_JPEG = frozenset({"jpg", "jpeg"})
# torch uint8 specs whose batches are built straight from the numpy decode (one copy into the batch)
_FAST_SPECS = {"torchrgb8": "rgb8", "torchrgba8": "rgba8", "torchl8": "l8"}
# specs the GPU decoder can produce: value = scale to float [0, 1]
_GPU_SPECS = {"torchrgb8": False, "torchrgb": True, "torch": True}

_warned: set[str] = set()


def _warn_once(message: str, category: type[Warning] = UserWarning) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, category, stacklevel=3)


def _split_ext(ext: str) -> tuple[str, str]:
    """'seg.png.gz' -> ('seg.png', 'png'): the extension without .gz, and its last part."""
    ext = ext.lower()
    inner = ext[:-3] if ext == "gz" or ext.endswith(".gz") else ext
    return inner, inner.rpartition(".")[2]


def _fingerprint(urls: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(urls).encode("utf-8", "surrogateescape")).hexdigest()[:16]


# ------------------------------------------------------------------------------------ batch values


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


class _HWC:
    """A decoded uint8 image (numpy HWC or HW) still to be placed into a CHW torch batch."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def tensor(self) -> torch.Tensor:  # what the codec's torch spec would have returned
        a = self.a
        if a.ndim == 3:
            a = np.ascontiguousarray(a.transpose(2, 0, 1))
        elif not a.flags.writeable:
            a = a.copy()
        return torch.from_numpy(a)


class _EndOfWorker:
    """Sent by a worker after its last item: carries its final counts to the Loader."""


class _RawJpeg:
    """JPEG bytes left for the GPU decoder."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _empty(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """A new tensor; in a DataLoader worker, in shared memory so sending it costs no extra copy."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    proto = torch.empty(0, dtype=dtype)
    numel = 1
    for n in shape:
        numel *= n
    storage = proto._typed_storage()._new_shared(numel, device=proto.device)
    return proto.new(storage).view(shape)


class _Ring:
    """Image batch buffers in shared memory that a worker reuses once nobody holds them any more.

    Sending a tensor from a DataLoader worker normally costs a fresh shared-memory segment per batch
    (create, zero-fill every page on first touch, unmap), which at 256x256 costs about as much as
    the JPEG decoding itself. Under a Loader, a worker writes image batches into one of `slots`
    buffers per worker, allocated once; the Loader marks a slot free again in `free` (a shared
    array, one flag per slot) once no tensor in the main process refers to that buffer any more
    (the batch and all views of it are gone: its storage's use count says so). A worker that
    finds no free slot allocates a fresh buffer instead, so it never waits, and a buffer is never
    written while anything can still read it.
    """

    def __init__(self, free: Any, slots: int, worker: int, batch_size: int) -> None:
        self.free = free
        self.slots = slots
        self.base = worker * slots
        self.batch_size = batch_size
        self.key: tuple | None = None
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.used: list[tuple[int, Any]] = []
        self.sent: set[int] = set()  # slots the Loader has mapped (it keeps them mapped all epoch)
        self.refs = True  # send later uses of a slot as a _SlotRef (no fd passing); off with pin_memory

    def take(self, n: int, shape: tuple[int, ...], dtype: torch.dtype, field: Any) -> torch.Tensor | None:
        """A buffer for `n` images of `shape` (recorded as used by `field`), or None (use a fresh one)."""
        if n > self.batch_size:
            return None
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
            buf = self.buffers[slot] = _empty((self.batch_size, *shape), dtype, True)
        self.used.append((slot, field))
        return buf[:n]

    def pop_used(self) -> tuple[tuple[int, Any], ...]:
        used, self.used = tuple(self.used), []
        return used

    def outgoing(self, item: Any) -> tuple[Any, tuple[tuple[int, Any], ...]]:
        """The item as it is sent (slots the Loader already maps become references) and its slots."""
        used = self.pop_used()
        if not self.refs:
            return item, used
        for slot, field in used:
            if slot in self.sent:
                value = item if field is None else item[field]
                ref = _SlotRef(slot, tuple(value.shape), tuple(value.stride()), value.storage_offset())
                item = _replace(item, field, ref)
            else:
                self.sent.add(slot)
        return item, used


class _SlotRef(NamedTuple):
    """A view of a ring slot the Loader already has mapped: sent instead of the tensor."""

    slot: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class _Small:
    """A small tensor sent inline (pickled bytes) rather than through a shared-memory segment."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a


def _inline_small(item: Any, limit: int = 1 << 16) -> Any:
    """Under a Loader, small tensors of a batch go inline: a segment + fd per tensor costs more."""

    def small(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and not v.is_shared() and v.device.type == "cpu" \
                and v.numel() * v.element_size() <= limit and v.dtype != torch.bfloat16:
            return _Small(v.numpy())
        return v

    if isinstance(item, dict):
        return {k: small(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(small(v) for v in item)
    return small(item)


class _RingReturns:
    """The Loader's side of the workers' rings: which slots the batches it returned still hold."""

    def __init__(self, free: Any, slots: int) -> None:
        self.free = free
        self.slots = slots
        self.mapped: dict[tuple[int, int], Any] = {}  # (worker, slot) -> (storage, dtype), mapped all epoch
        self.pending: set[tuple[int, int]] = set()

    def received(self, item: Any, worker: int, used: tuple[tuple[int, Any], ...]) -> Any:
        """The item with slot references resolved; records which slots it holds."""
        done = []
        for slot, field in used:
            key = (worker, slot)
            value = item if field is None else item[field]
            if isinstance(value, _SlotRef):
                storage, dtype = self.mapped[key]
                value = torch.empty(0, dtype=dtype).set_(storage, value.offset, value.shape, value.stride)
                item = _replace(item, field, value)
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


def _replace(item: Any, field: Any, value: Any) -> Any:
    if field is None:
        return value
    if isinstance(item, tuple):
        return item[:field] + (value,) + item[field + 1:]
    item[field] = value
    return item


def _unwrap_small(item: Any, pin: bool) -> Any:
    def unwrap(v: Any) -> Any:
        if isinstance(v, _Small):
            t = torch.from_numpy(v.a)
            return t.pin_memory() if pin else t
        return v

    if isinstance(item, dict):
        return {k: unwrap(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(unwrap(v) for v in item)
    return unwrap(item)


def _pack_jpegs(values: list[_RawJpeg], single: bool) -> PackedJpegs:
    sizes = [len(v.data) for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = torch.from_numpy(np.frombuffer(b"".join(v.data for v in values), dtype=np.uint8).copy())
    return PackedJpegs(data, torch.from_numpy(offsets), single)


def _image_batch(
    n: int, shape: tuple[int, ...], dtype: torch.dtype, shared: bool, ring: _Ring | None, field: Any
) -> torch.Tensor:
    out = ring.take(n, shape, dtype, field) if ring is not None else None
    return out if out is not None else _empty((n, *shape), dtype, shared)


def _collate_column(
    values: list[Any], shared: bool, channels_last: bool = False, ring: _Ring | None = None, field: Any = None
) -> Any:
    first = values[0]
    if isinstance(first, _HWC):
        if all(isinstance(v, _HWC) for v in values):
            shape, dtype = first.a.shape, first.a.dtype
            if all(v.a.shape == shape and v.a.dtype == dtype for v in values):
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
                        o[i] = v.a.transpose(2, 0, 1)
                else:
                    out = _image_batch(n, shape, tdtype, shared, ring, field)
                    o = out.numpy()
                    for i, v in enumerate(values):
                        o[i] = v.a
                return out
        values = [v.tensor() if isinstance(v, _HWC) else v for v in values]
        first = values[0]
    if isinstance(first, _RawJpeg):
        if all(isinstance(v, _RawJpeg) for v in values):
            return _pack_jpegs(values, single=False)
    if any(isinstance(v, _RawJpeg) for v in values):  # JPEG and other images under one field
        return [_pack_jpegs([v], single=True) if isinstance(v, _RawJpeg) else v for v in values]
    if isinstance(first, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            big = shared and len(values) * first.numel() * first.element_size() >= 1 << 16
            out = _empty((len(values), *first.shape), first.dtype, big) if first.device.type == "cpu" else None
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


def collate(samples: list[Any], shared: bool = False, channels_last: bool = False, ring: _Ring | None = None) -> Any:
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
        return {k: _collate_column([s.get(k) for s in samples], shared, channels_last, ring, k) for k in keys}
    if isinstance(first, tuple):
        return tuple(_collate_column(list(col), shared, channels_last, ring, i) for i, col in enumerate(zip(*samples)))
    return _collate_column(samples, shared, channels_last, ring)


def _finish_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply fn to the leaves that need finishing (inside dicts, tuples, lists)."""
    if isinstance(value, (PackedJpegs, _HWC, _RawJpeg)):
        return fn(value)
    if isinstance(value, dict):
        return {k: _finish_values(v, fn) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_finish_values(v, fn) for v in value)
    if isinstance(value, list):
        return [_finish_values(v, fn) for v in value]
    return value


# ------------------------------------------------------------------------------------ manifest


def _norm_url(url: str) -> str:
    if _urls.is_local(url):
        return os.path.abspath(_urls.local_path(url))
    return url.rstrip("/")


def _dirname(url: str) -> str:
    return url.rsplit("/", 1)[0] if "/" in url else "."


def _read_json(url: str, storage_options: Any) -> Any:
    with _urls.open_read(url, storage_options) as f:
        return json.loads(f.read())


def load_manifest(
    manifest: Any, shard_urls: Sequence[str], storage_options: Any = None
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The manifest entry of every shard, in shard order, and where it came from; (None, None) when
    there is no usable manifest.

    `manifest`: None (look for `<dir of first shard>/_shardflow/summary.json`, used only if it lists
    every shard), a run-directory or summary.json URL, a list of {"url", "nsamples", ...} entries
    (ShardInfo.to_json()), or False (never look).
    """
    if manifest is False:
        return None, None
    explicit = manifest is not None
    if isinstance(manifest, (list, tuple)):
        entries = [e.to_json() if hasattr(e, "to_json") else dict(e) for e in manifest]
        source, base_dir = "<list>", None
    else:
        if manifest is None:
            source = _urls.join(_dirname(shard_urls[0]), "_shardflow", "summary.json")
        else:
            source = str(manifest)
            if not source.endswith(".json"):
                source = _urls.join(source, "summary.json")
        try:
            data = _read_json(source, storage_options)
        except (ShardIOError, OSError, ValueError) as exc:
            if explicit:
                raise ShardIOError(f"cannot read the manifest: {exc}", url=source) from exc
            return None, None
        entries = data.get("shards") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            if explicit:
                raise ValueError(f"manifest {source} has no 'shards' list")
            return None, None
        base_dir = _dirname(_dirname(source))  # the outputs directory the run dir sits in
    by_url: dict[str, dict[str, Any]] = {}
    by_name: dict[str, dict[str, Any]] = {}
    for e in entries:
        if not isinstance(e, dict) or "url" not in e or "nsamples" not in e:
            continue
        by_url[_norm_url(str(e["url"]))] = e
        by_name.setdefault(str(e["url"]).rsplit("/", 1)[-1], e)
    out = []
    missing = []
    for url in shard_urls:
        e = by_url.get(_norm_url(url))
        if e is None and base_dir is not None and _norm_url(_dirname(url)) == _norm_url(base_dir):
            e = by_name.get(url.rsplit("/", 1)[-1])
        if e is None:
            missing.append(url)
        else:
            out.append(e)
    if missing:
        if explicit:
            raise ValueError(
                f"manifest {source} does not list {len(missing)} of the {len(shard_urls)} shards, e.g. {missing[0]}"
            )
        return None, None
    return out, source


# ------------------------------------------------------------------------------------ errors


class _ErrorCount:
    """Counts problems a consumer skipped; raises or warns as `on_error` says."""

    def __init__(self, on_error: str, count: int = 0) -> None:
        self.on_error = on_error
        self.count = count

    def reported(self, error: ShardflowError) -> None:
        """A problem read_samples already handled (it warns itself when on_error='warn')."""
        self.count += 1

    def handle(self, error: Exception) -> None:
        if self.on_error == "raise":
            raise error
        self.count += 1
        if self.on_error == "warn":
            warnings.warn(str(error), ShardflowWarning, stacklevel=3)


# ------------------------------------------------------------------------------------ dataset


class ShardDataset(IterableDataset):
    """Samples (or batches) of WebDataset tar shards from any fsspec URL, split across ranks and
    DataLoader workers so that an epoch delivers every sample once.

    Parameters
    - spec: shard spec (brace pattern, glob, list; see shardflow.urls.expand).
    - decode: image spec for codecs.Decoder (`"torchrgb8"`, `"torchrgb"`, `"rgb8"`, `"pil"`, ... or None
      for raw bytes). `"torchrgb8-gpu"` (or `gpu_decode=True`) decodes JPEGs on the GPU in batches in
      the main process (Loader, or in-process iteration); without a GPU it warns and decodes on CPU.
    - only, allow_pickle: passed to the Decoder.
    - shuffle: shuffle-buffer size in samples (True: 1000; 0/False: keep order). The buffer holds raw
      (still encoded) samples. shardshuffle: shuffle the shard order per epoch (default: shuffle > 0).
    - batch_size: batch inside each worker (whole batches cross the process boundary); partial: keep
      each worker's last incomplete batch; collate: custom collate function (default `collate`).
    - seed, set_epoch(e): the order is a function of (seed, epoch, rank, worker); seed=None picks one.
    - resampled: draw shards with replacement forever (epoch_size then bounds an epoch).
    - epoch_size: samples per epoch over all ranks (fixes the count, for len() and resampled streams).
    - equalize: None, "drop" or "pad": the same number of samples (and batches) on every rank.
    - map: fn(sample) -> sample or None (drop); raise SkipSample to skip and count.
    - to_tuple: fields to return as a tuple, e.g. "jpg;png cls" ("a;b" = first present).
    - manifest: sample counts per shard; None: use `<dir of first shard>/_shardflow/summary.json` if
      it lists every shard; a run-dir/summary.json URL; a list of ShardInfo dicts; False: never.
    - channels_last: image batches of torch uint8 specs come as (B, C, H, W) tensors in channels-last
      memory (`batch.is_contiguous(memory_format=torch.channels_last)`): the decoded HWC pixels are
      copied into the batch as they are, skipping the HWC -> CHW transposition (a quarter of the
      decode cost at 256x256). Same values; use `.reshape`, not `.view`, on them.
    - storage_options: fsspec options (flat or per URL prefix). cache_dir/cache_size: local LRU cache
      of remote shards.
    - on_error: "raise", "skip" or "warn" (skip and warn) for bad samples and damaged shards. A shard
      that cannot be opened (missing) is always an error naming it.
    - split_by_node / split_by_worker, rank / world_size: override the splitting (default: split by
      torch.distributed rank when initialised, else the RANK/WORLD_SIZE environment, and by worker).
    """

    def __init__(
        self,
        spec: str | Sequence[str],
        *,
        decode: str | None = "torchrgb8",
        only: Iterable[str] | str | None = None,
        allow_pickle: bool = False,
        shuffle: int | bool = 0,
        shardshuffle: bool | None = None,
        batch_size: int | None = None,
        partial: bool = True,
        collate: Callable[[list[Any]], Any] | None = None,
        seed: int | None = 0,
        resampled: bool = False,
        epoch_size: int | None = None,
        equalize: str | None = None,
        map: Callable[[dict[str, Any]], Any] | None = None,  # noqa: A002 (webdataset's name)
        to_tuple: str | Sequence[str] | None = None,
        manifest: Any = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_size: int | str = "20GB",
        on_error: str = "warn",
        split_by_node: bool = True,
        split_by_worker: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        gpu_decode: bool = False,
        device: str | torch.device = "cuda",
        channels_last: bool = False,
        allow_pipe: bool = False,
    ) -> None:
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if equalize not in EQUALIZE:
            raise ValueError(f"equalize must be one of {EQUALIZE}, got {equalize!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be >= 1 (or None)")
        if epoch_size is not None and epoch_size < 0:
            raise ValueError("epoch_size must be >= 0")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank= and world_size=, or neither")
        self.spec = spec
        self.storage_options = storage_options
        self.allow_pipe = allow_pipe
        self.urls = _urls.expand(spec, storage_options)
        self.fingerprint = _fingerprint(self.urls)

        # decoding
        if isinstance(decode, str) and decode.endswith(GPU_SUFFIX):
            decode, gpu_decode = decode[: -len(GPU_SUFFIX)], True
        if decode is not None and decode not in IMAGE_SPECS:
            raise ValueError(f"unknown decode spec {decode!r}; use None or one of: {', '.join(IMAGE_SPECS)} (+'-gpu')")
        self.decode = decode
        self.only = only
        self.allow_pickle = allow_pickle
        self._decoder = Decoder(decode, allow_pickle=allow_pickle, only=only) if decode is not None else None
        self.gpu_decode = False
        self.device = device
        if gpu_decode:
            if decode not in _GPU_SPECS:
                raise ValueError(f"GPU decode produces {sorted(_GPU_SPECS)} tensors, not {decode!r}")
            if map is not None:
                raise ValueError(
                    "map= runs in the workers, before a GPU decode would happen; use gpu_decode with "
                    "to_tuple only and transform the decoded batch on the GPU"
                )
            if torch.cuda.is_available():
                self.gpu_decode = True
            else:
                _warn_once(f"decode={decode}-gpu: no CUDA device here, decoding JPEGs on the CPU instead")
        self.channels_last = channels_last
        fast = decode in _FAST_SPECS and batch_size is not None and map is None and collate is None
        self._fast_decoder = Decoder(_FAST_SPECS[decode], allow_pickle=allow_pickle, only=only) if fast else None

        # order and splitting
        if shuffle is True:
            shuffle = DEFAULT_SHUFFLE
        self.shuffle = int(shuffle or 0)
        self.shardshuffle = self.shuffle > 0 if shardshuffle is None else bool(shardshuffle)
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed)
        self.resampled = resampled
        self.epoch_size = epoch_size
        self.equalize = equalize
        self.batch_size = batch_size
        self.partial = partial
        self.collate_fn = collate
        self.map = map
        if isinstance(to_tuple, str):
            to_tuple = to_tuple.split()
        self.to_tuple = None if to_tuple is None else [f.split(";") for f in to_tuple]
        self.on_error = on_error
        self.split_by_node = split_by_node
        self.split_by_worker = split_by_worker
        self._rank_world = None if rank is None else (int(rank), int(world_size))  # type: ignore[arg-type]
        self.epoch = 0
        self._iterations = 0  # iterations of this object since set_epoch (see __iter__)

        # sample counts
        entries, self.manifest = load_manifest(manifest, self.urls, storage_options)
        self.counts = None if entries is None else [int(e["nsamples"]) for e in entries]
        self._nbytes = None if entries is None else [e.get("nbytes") for e in entries]
        self._sha256 = None if entries is None else [e.get("sha256") for e in entries]
        if equalize is not None and self.counts is None and epoch_size is None and not resampled:
            raise ValueError(
                "equalize= needs known sample counts: pass manifest= (a job's run directory or its "
                "summary.json) or epoch_size="
            )
        if resampled and equalize is not None and epoch_size is None:
            raise ValueError("equalize= with resampled=True needs epoch_size=")

        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self._cache: ShardCache | None = None

        # resume and progress (in-process iteration) and flags set on the Loader's copy
        self._resume: dict[str, Any] | None = None
        self._progress: dict[str, Any] | None = None
        self._tagged = False  # yield (item, tag): set on the copy a Loader iterates
        self._ring_flags: Any = None  # (shared flags, slots per worker): set on a Loader's copy
        self._num_workers_hint: int | None = None

    # -- layout ----------------------------------------------------------------------------------

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size): explicit, else torch.distributed when initialised, else the env."""
        if self._rank_world is not None:
            return self._rank_world
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except (ImportError, RuntimeError):
            pass
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        if not 0 <= rank < world:
            raise ValueError(f"RANK={rank} is not in range for WORLD_SIZE={world}")
        return rank, world

    def _plan_rank_world(self) -> tuple[int, int]:
        return self.rank_world() if self.split_by_node else (0, 1)

    def _consumers(self, worker: int, workers: int) -> tuple[Consumer, Consumer]:
        """(actual consumer, consumer used for splitting)."""
        rank, world = self.rank_world()
        actual = Consumer(rank, world, worker, max(1, workers))
        prank, pworld = self._plan_rank_world()
        pworker, pworkers = (worker, max(1, workers)) if self.split_by_worker else (0, 1)
        return actual, Consumer(prank, pworld, pworker, pworkers)

    def assignment(self, worker: int = 0, workers: int = 1, epoch: int | None = None) -> Assignment:
        """What the consumer (this rank, `worker` of `workers`) reads in `epoch` (not resampled)."""
        _, plan = self._consumers(worker, workers)
        return assign(
            len(self.urls), plan, counts=self.counts, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
            shardshuffle=self.shardshuffle, equalize=self.equalize, epoch_size=self.epoch_size,
            batch_size=self.batch_size, partial=self.partial,
        )

    def _quota(self, workers: int, worker: int) -> int | None:
        """For resampled streams: samples this worker yields per epoch (None: forever)."""
        if self.epoch_size is None:
            return None
        _, plan = self._consumers(worker, workers)
        return assign(
            len(self.urls), plan, counts=None, seed=self.seed, epoch=0, shardshuffle=False,
            equalize=self.equalize, epoch_size=self.epoch_size, batch_size=self.batch_size, partial=self.partial,
        ).quota

    def __len__(self) -> int:
        """Items (batches when batch_size is set, else samples) this rank gets per epoch."""
        rank, world = self._plan_rank_world()
        n = rank_length(
            None if self.resampled else self.counts, world, rank, equalize=self.equalize,
            epoch_size=self.epoch_size, batch_size=self.batch_size, partial=self.partial,
        )
        if n is None:
            why = "resampled=True without epoch_size= is an endless stream" if self.resampled else (
                "the shards' sample counts are unknown (no manifest found at "
                f"{_urls.join(_dirname(self.urls[0]), '_shardflow', 'summary.json')})"
            )
            raise TypeError(
                f"len() of this ShardDataset is unknown: {why}; pass manifest= (a job's run directory or "
                "its summary.json) or epoch_size= (samples per epoch over all ranks)"
            )
        return n

    @property
    def nsamples(self) -> int | None:
        """Samples in all shards, when the manifest says."""
        return None if self.counts is None else sum(self.counts)

    # -- epochs and state ------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs: its shard order and shuffle depend on
        (seed, epoch, rank, worker). Without set_epoch, each further iteration of the same object
        runs the next epoch (in-process, and in persistent DataLoader workers)."""
        epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != epoch:
            self._resume = None
        self.epoch = epoch
        self._iterations = 0

    def state_dict(self) -> dict[str, Any]:
        """Progress of in-process iteration (use Loader.state_dict() with DataLoader workers)."""
        p = self._progress
        if p is None:
            p = {"epoch": self.epoch + self._iterations, "finished": False, "workers": {}, "num_workers": 0}
        rank, world = self._plan_rank_world()
        return _state(self, p["epoch"], p["finished"], p["workers"], p["num_workers"], rank, world)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration of the recorded epoch skips what was delivered before
        (a finished epoch moves on to the next one)."""
        _check_state(self, state)
        self._iterations = 0
        if state["finished"]:
            self.epoch = int(state["epoch"]) + 1
            self._resume = None
        else:
            self.epoch = int(state["epoch"])
            self._resume = {
                "epoch": self.epoch,
                "num_workers": int(state["num_workers"]),
                "workers": {int(k): tuple(v) for k, v in state["workers"].items()},
            }
        self._progress = None

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        in_worker = info is not None
        gpu_defer = self.gpu_decode and (self._tagged or not in_worker)
        if self.gpu_decode and in_worker and not self._tagged:
            _warn_once("GPU JPEG decode runs in the main process: iterate with shardflow.Loader; "
                       "decoding on CPU in the DataLoader workers instead")
        finish_here = gpu_defer and not self._tagged
        epoch = self.epoch + self._iterations
        self._iterations += 1
        resume = self._resume if self._resume is not None and self._resume["epoch"] == epoch else None
        if resume is not None and max(1, resume["num_workers"]) != max(1, workers):
            raise ValueError(
                f"the state was saved with num_workers={resume['num_workers']}; resume with the same number "
                f"(now {workers}): each worker replays its own part of the epoch"
            )
        start = resume["workers"].get(worker, (0, 0, 0)) if resume is not None else (0, 0, 0)
        if not in_worker:
            self._resume = None  # consumed (a worker's copy is thrown away anyway)
            self._progress = {
                "epoch": epoch, "finished": False, "num_workers": workers,
                "workers": dict(resume["workers"]) if resume is not None else {},
            }
        items = self._consumer_items(worker, workers, epoch, start, gpu_defer)
        try:
            for item, tag in items:
                if self._tagged:
                    yield item, tag
                    continue
                if not in_worker:
                    self._progress["workers"][worker] = tag[1:4]  # type: ignore[index]
                if isinstance(item, _EndOfWorker):
                    continue
                yield self.finish(item) if finish_here else item
        finally:
            items.close()
        if not in_worker and self._progress is not None:
            self._progress["finished"] = True

    def _consumer_items(
        self, worker: int, workers: int, epoch: int, start: tuple[int, int, int], gpu_defer: bool
    ) -> Iterator[tuple[Any, tuple[Any, ...]]]:
        """(sample or batch, tag) of one consumer's epoch; tag = (worker, raw position, delivered,
        errors, ring slots the item uses)."""
        actual, plan = self._consumers(worker, workers)
        skip, delivered, errors0 = start
        errors = _ErrorCount(self.on_error, errors0)
        if self.resampled:
            assignment = None
            quota = self._quota(workers, worker)
        else:
            assignment = self.assignment(worker, workers, epoch)
            quota = assignment.quota
            if assignment.split_inside and (worker == 0 or not self.split_by_worker):
                _warn_once(_split_message(self, plan.workers))
        batch_size = self.batch_size
        shared = get_worker_info() is not None
        ring = None
        if shared and self._ring_flags is not None and batch_size is not None and self.collate_fn is None:
            flags, slots, refs = self._ring_flags
            ring = _Ring(flags, slots, worker, batch_size)
            ring.refs = refs
        none: tuple[int, ...] = ()
        raw_pos = 0
        batch: list[Any] = []
        tag_worker = worker
        for pass_no in itertools.count():
            if quota is not None and delivered + len(batch) >= quota:
                break
            if pass_no > 0 and (quota is None or self.resampled):
                break
            source = self._source(assignment, actual, epoch, errors)
            stream = self._shuffled(source, rng_for(self.seed, epoch, actual.rank, actual.worker, TAG_BUFFER, pass_no))
            raw_in_pass = fresh_in_pass = delivered_in_pass = 0
            try:
                for raw in stream:
                    raw_pos += 1
                    raw_in_pass += 1
                    if raw_pos <= skip:
                        continue
                    fresh_in_pass += 1
                    sample = self._prepare(raw, errors, gpu_defer)
                    if sample is None:
                        continue
                    delivered_in_pass += 1
                    if batch_size is None:
                        delivered += 1
                        yield _finish_unbatched(sample, gpu_defer), (tag_worker, raw_pos, delivered, errors.count, none)
                    else:
                        batch.append(sample)
                        if len(batch) == batch_size:
                            delivered += len(batch)
                            out, used = self._outgoing(self._collate(batch, shared, ring), ring)
                            batch = []
                            yield out, (tag_worker, raw_pos, delivered, errors.count, used)
                    if quota is not None and delivered + len(batch) >= quota:
                        break
            finally:
                stream.close()
            if raw_in_pass == 0 or (fresh_in_pass > 0 and delivered_in_pass == 0):
                if quota is not None and delivered + len(batch) < quota:
                    _warn_once(
                        f"rank {actual.rank} worker {actual.worker}: no samples to repeat, so it yields "
                        f"{delivered + len(batch)} instead of {quota} (ranks may get unequal counts)"
                    )
                break
        if batch and (self.partial or (quota is not None and delivered + len(batch) >= quota)):
            delivered += len(batch)
            out, used = self._outgoing(self._collate(batch, shared, ring), ring)
            yield out, (tag_worker, raw_pos, delivered, errors.count, used)
        # the final tally (problems found after the last batch), not an item for the user
        yield _EndOfWorker(), (tag_worker, raw_pos, delivered, errors.count, none)

    def _outgoing(self, item: Any, ring: _Ring | None) -> tuple[Any, tuple]:
        """A batch as a Loader's worker sends it: ring slots as references, small tensors inline."""
        if ring is None:
            return item, ()
        item, used = ring.outgoing(item)
        return _inline_small(item), used

    def _collate(self, batch: list[Any], shared: bool, ring: _Ring | None = None) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(batch)
        return collate(batch, shared, self.channels_last, ring)

    def _source(
        self, assignment: Assignment | None, actual: Consumer, epoch: int, errors: _ErrorCount
    ) -> Iterator[dict]:
        """Raw samples of one pass over the consumer's part (endless when resampled)."""
        if assignment is None:
            rng = rng_for(self.seed, epoch, actual.rank, actual.worker, TAG_RESAMPLE)
            for shard in resampled_shards(len(self.urls), self.counts, rng):
                yield from self._read_segment(Segment(shard), errors)
            return
        for segment in assignment.segments:
            yield from self._read_segment(segment, errors)

    def _open(self, index: int) -> Any:
        url = self.urls[index]
        options = self.storage_options  # flat or per URL prefix: urls.open_read picks what applies
        if self.cache_dir is None or _urls.is_local(url) or url.startswith("pipe:") or url == "-":
            return _urls.open_read(url, options, allow_pipe=self.allow_pipe)
        if self._cache is None:
            self._cache = ShardCache(self.cache_dir, self.cache_size)
        return self._cache.open(
            url, lambda: _urls.open_read(url, options, allow_pipe=self.allow_pipe),
            nbytes=self._nbytes[index] if self._nbytes else None,
            sha256=self._sha256[index] if self._sha256 else None,
        )

    def _read_segment(self, segment: Segment, errors: _ErrorCount) -> Iterator[dict]:
        url = self.urls[segment.shard]
        stream = self._open(segment.shard)  # a shard that cannot be opened is always an error
        complete = False
        try:
            samples = read_samples(stream, url, on_error=self.on_error, report=errors.reported)
            try:
                stop = segment.stop
                for i, sample in enumerate(samples):
                    if segment.take(i):
                        yield sample
                    if stop is not None and i + 1 >= stop:
                        # the range ends here; the shard is whole only if its last sample was read
                        complete = self.counts is not None and stop >= self.counts[segment.shard]
                        break
                else:
                    complete = True
            except ShardIOError:
                raise
            except ShardflowError as exc:  # damage that ends the shard (truncation, corrupt gzip)
                errors.handle(exc)
            finally:
                samples.close()
        finally:
            finish = getattr(stream, "finish", None)
            try:
                if complete and finish is not None:
                    finish()  # read the end of the archive, check it and keep it in the cache
            except Exception as exc:  # noqa: BLE001 (the samples were fine; only the cache copy is lost)
                _warn_once(f"shard {url}: not cached ({type(exc).__name__}: {exc})")
            finally:
                stream.close()

    def _shuffled(self, samples: Iterator[dict], rng: Any) -> Iterator[dict]:
        size = self.shuffle
        try:
            if size <= 1:
                yield from samples
                return
            initial = min(size, max(64, size // 10))
            buf: list[dict] = []
            end = object()
            for sample in samples:
                buf.append(sample)
                if len(buf) < size:
                    more = next(samples, end)
                    if more is not end:
                        buf.append(more)  # type: ignore[arg-type]
                if len(buf) >= initial:
                    i = rng.randrange(len(buf))
                    buf[i], buf[-1] = buf[-1], buf[i]
                    yield buf.pop()
            while buf:
                i = rng.randrange(len(buf))
                buf[i], buf[-1] = buf[-1], buf[i]
                yield buf.pop()
        finally:
            samples.close()  # type: ignore[attr-defined]

    def _image_field(self, key: str, decoder: Decoder, jpeg_only: bool) -> bool:
        """Is `key` an image entry this decoder decodes with a builtin codec (memoised per key)?"""
        memo = self.__dict__.setdefault("_field_memo", {})
        answer = memo.get((key, jpeg_only))
        if answer is None:
            last = _split_ext(key)[1]
            answer = (not key.startswith("__") and last in (_JPEG if jpeg_only else IMAGE_EXTENSIONS)
                      and decoder.wants(key) and not _user_codec(decoder, key))
            memo[(key, jpeg_only)] = answer
        return answer

    def _prepare(self, raw: dict[str, Any], errors: _ErrorCount, gpu_defer: bool) -> Any:
        """Decode, map and to_tuple one raw sample; None when it is dropped or skipped."""
        try:
            sample = raw
            jpegs = None
            if gpu_defer and self._decoder is not None:
                jpegs = {k: _RawJpeg(v) for k, v in raw.items()
                         if isinstance(v, (bytes, bytearray)) and self._image_field(k, self._decoder, True)}
                if jpegs:
                    sample = {k: v for k, v in raw.items() if k not in jpegs}
            fast = self._fast_decoder
            if fast is not None and not gpu_defer:
                sample = fast(sample)
                for k, v in sample.items():
                    if type(v) is np.ndarray and v.dtype == np.uint8 and v.ndim in (2, 3) \
                            and self._image_field(k, fast, False):
                        sample[k] = _HWC(v)
            elif self._decoder is not None:
                sample = self._decoder(sample)
            if jpegs:
                sample.update(jpegs)
            if self.map is not None:
                sample = self.map(sample)
                if sample is None:
                    return None
            if self.to_tuple is not None:
                sample = self._tuple(sample)
            return sample
        except DecodeError as exc:
            errors.handle(exc)
        except SkipSample as exc:
            errors.handle(SampleError(f"skipped by map: {exc.reason}", url=raw.get("__url__"), key=raw.get("__key__")))
        return None

    def _tuple(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        out = []
        for choices in self.to_tuple:  # type: ignore[union-attr]
            for name in choices:
                if name in sample:
                    out.append(sample[name])
                    break
            else:
                has = sorted(k for k in sample if not k.startswith("__"))
                raise DecodeError(
                    f"sample has none of {';'.join(choices)!r} (has {has})",
                    url=sample.get("__url__"), key=sample.get("__key__"),
                )
        return tuple(out)

    # -- GPU decode (main process) ---------------------------------------------------------------

    def finish(self, item: Any) -> Any:
        """Decode the JPEGs a worker left encoded (GPU decode); other values pass through."""
        return _finish_values(item, self._decode_packed)

    def _decode_packed(self, value: Any) -> Any:
        if isinstance(value, _HWC):
            return value.tensor()
        if isinstance(value, _RawJpeg):
            value = _pack_jpegs([value], single=True)
        views = value.views()
        device = torch.device(self.device)
        try:
            import torchvision.io as tvio

            images = tvio.decode_jpeg(views, mode=tvio.ImageReadMode.RGB, device=device)
        except Exception as exc:  # unsupported JPEG (CMYK, ...), no nvjpeg: decode on the CPU
            _warn_once(f"GPU JPEG decode failed ({type(exc).__name__}: {exc}); decoding those batches on the CPU")
            images = [
                decode_value("jpg", v.numpy().tobytes(), "torchrgb8", self.allow_pickle).to(device) for v in views
            ]
        scale = _GPU_SPECS[self.decode]  # type: ignore[index]
        if value.single:
            img = images[0]
            return img.float().div_(255) if scale else img
        if all(i.shape == images[0].shape for i in images):
            out = torch.stack(images)
            if self.channels_last:
                out = out.contiguous(memory_format=torch.channels_last)
            return out.float().div_(255) if scale else out
        return [i.float().div_(255) if scale else i for i in images]

    # -- pickling (DataLoader workers with spawn/forkserver) -------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_progress"] = None
        if state["_rank_world"] is None:
            try:
                state["_rank_world"] = self.rank_world()  # as the main process sees it
            except ValueError:
                pass
        return state


def _user_codec(decoder: Decoder, ext: str) -> bool:
    inner, last = _split_ext(ext)
    codecs = getattr(decoder, "codecs", {})
    return inner in codecs or last in codecs


def _finish_unbatched(sample: Any, gpu_defer: bool) -> Any:
    """Unbatched samples carry no batch-only placeholders, except raw JPEGs for the GPU."""
    if gpu_defer:
        return _finish_values(sample, lambda v: _pack_jpegs([v], single=True) if isinstance(v, _RawJpeg) else v)
    return sample


def _state(ds: ShardDataset, epoch: int, finished: bool, workers: dict[int, Any], num_workers: int,
           rank: int, world: int) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "epoch": int(epoch),
        "finished": bool(finished),
        "seed": ds.seed,
        "shards": ds.fingerprint,
        "rank": rank,
        "world_size": world,
        "num_workers": int(num_workers),
        "config": _order_config(ds),
        "workers": {str(k): [int(x) for x in v] for k, v in sorted(workers.items())},
    }


def _order_config(ds: ShardDataset) -> dict[str, Any]:
    """The parameters (besides shards, seed and layout) that a worker's sequence depends on."""
    return {
        "shuffle": ds.shuffle, "shardshuffle": ds.shardshuffle, "batch_size": ds.batch_size,
        "partial": ds.partial, "equalize": ds.equalize, "epoch_size": ds.epoch_size,
        "resampled": ds.resampled, "split_by_node": ds.split_by_node, "split_by_worker": ds.split_by_worker,
        "counts": _fingerprint([str(n) for n in ds.counts]) if ds.counts is not None else None,
    }


def _check_state(ds: ShardDataset, state: dict[str, Any]) -> None:
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a ShardDataset state (version {STATE_VERSION}): {state!r:.200}")
    if state["shards"] != ds.fingerprint:
        raise ValueError("the state was saved for a different list of shards")
    if state["seed"] != ds.seed:
        raise ValueError(f"the state was saved with seed={state['seed']}, this dataset has seed={ds.seed}")
    if state.get("config") != _order_config(ds):
        theirs, ours = state.get("config") or {}, _order_config(ds)
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise ValueError(f"the state was saved with other reader settings ({', '.join(diff)} differ)")
    rank, world = ds._plan_rank_world()
    if state["world_size"] != world or state["rank"] != rank:
        raise ValueError(
            f"the state was saved by rank {state['rank']} of {state['world_size']}; this is rank {rank} of {world} "
            "(resume each rank from its own state, with the same world size)"
        )


# ------------------------------------------------------------------------------------ loader


class Loader:
    """A DataLoader over a ShardDataset that knows where it is.

    - iterating it runs one epoch (`set_epoch` is called for you: 0, 1, 2, ... or what you set);
    - `state_dict()` records, per worker, how far the batches *returned to you* got, and
      `load_state_dict()` makes the next iteration yield exactly the rest of that epoch;
    - JPEGs are decoded on the GPU here, in batches, when the dataset asks for it;
    - `stats` counts the samples delivered and skipped (error policy) this epoch.
    Keyword arguments go to torch's DataLoader (pin_memory defaults to "a CUDA device is present";
    in_order=False lets a fast worker's batch overtake a slow one's: each worker's batches stay
    deterministic and resumable, only their interleaving varies). persistent_workers is refused:
    workers start per epoch, carrying the epoch and the resume point.

    The resume guarantee, precisely. Each worker's sequence of batches is a pure function of the
    shard list, the sample counts, seed, epoch, rank, world size, worker id, num_workers and the
    order settings (shuffle, batch_size, equalize, ...). Every batch carries, for its worker, the
    number of raw samples that worker had drawn from its shuffle buffer (`raw`, counting samples it
    then skipped as bad) and the number it had delivered. `state_dict()` holds those numbers for the
    last batch of each worker that the Loader has *returned to you*. A Loader built the same way and
    given that state replays each worker's raw stream, skips its first `raw` samples without
    decoding them (I/O only) and goes on from there. So over the rest of the epoch it yields exactly
    the batches of that epoch that had not been returned before: none twice (batches prefetched
    but not returned are produced again, not lost), none missing, each worker's batches with the
    same contents in the same order; only the interleaving of workers may differ. The shard list,
    seed, order settings, rank, world size and num_workers must be the same (checked: a mismatch is
    a ValueError). A state taken after an epoch ended resumes at the start of the next epoch. With a
    plain DataLoader, `ShardDataset.load_state_dict(state)` resumes the same way.

    Zero-copy batches. Image batches cross from the workers in a few shared-memory buffers per
    worker that are reused (see `_Ring`): a buffer goes back to its worker only when no tensor in this
    process refers to it any more (the batch and every view of it are gone), so batches you keep stay
    intact. A batch handed on to *another* process (a multiprocessing queue) should be `.clone()`d
    first. With pin_memory=True the pinned copy is what you get, and buffers return at once.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        num_workers: int = 0,
        *,
        pin_memory: bool | None = None,
        prefetch_factor: int | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError("Loader needs a ShardDataset")
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("Loader starts its workers per epoch (the epoch and resume point travel with them)")
        self.dataset = dataset
        self.num_workers = int(num_workers)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._pinning = bool(self.pin_memory) and torch.cuda.is_available()  # what DataLoader really does
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self.kwargs = dataloader_kwargs
        self.epoch = dataset.epoch
        self._positions: dict[int, tuple[int, int, int]] = {}
        self._resume: dict[str, Any] | None = None
        self._finished = False

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Run `epoch` next (a resume point loaded for another epoch is dropped)."""
        if int(epoch) != self.epoch:
            self._resume = None
            self._positions = {}
        self._finished = False
        self.epoch = int(epoch)

    @property
    def stats(self) -> dict[str, int]:
        return {
            "skipped": sum(p[2] for p in self._positions.values()),
            "delivered": sum(p[1] for p in self._positions.values()),
        }

    def state_dict(self) -> dict[str, Any]:
        rank, world = self.dataset._plan_rank_world()
        return _state(self.dataset, self.epoch, self._finished, self._positions, self.num_workers, rank, world)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(self.dataset, state)
        if max(1, int(state["num_workers"])) != max(1, self.num_workers):
            raise ValueError(
                f"the state was saved with num_workers={state['num_workers']}; this Loader has "
                f"{self.num_workers} (each worker replays its own part of the epoch)"
            )
        if state["finished"]:
            self.epoch, self._resume = int(state["epoch"]) + 1, None
            self._positions = {}
        else:
            self.epoch = int(state["epoch"])
            self._positions = {int(k): tuple(v) for k, v in state["workers"].items()}  # type: ignore[misc]
            self._resume = {"epoch": self.epoch, "num_workers": self.num_workers, "workers": dict(self._positions)}
        self._finished = False

    def __iter__(self) -> Iterator[Any]:
        if self._finished:  # the previous epoch ran to its end: go on with the next one
            self.epoch += 1
            self._positions, self._finished = {}, False
        ds = copy.copy(self.dataset)
        ds.set_epoch(self.epoch)  # (also resets the copy's iteration count)
        ds._resume = self._resume
        ds._progress = None
        ds._tagged = True
        resume, self._resume = self._resume, None
        self._positions = dict(resume["workers"]) if resume is not None else {}
        # Say once, here in the main process, what worker 0 would say in every epoch.
        if not ds.resampled and ds.assignment(0, max(1, self.num_workers)).split_inside:
            _warn_once(_split_message(ds, max(1, self.num_workers)))
        kwargs = dict(self.kwargs)
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        if self.num_workers > 0 and ds.batch_size is not None and ds.collate_fn is None:
            ctx = kwargs.get("multiprocessing_context") or torch.multiprocessing.get_context()
            if isinstance(ctx, str):
                ctx = torch.multiprocessing.get_context(ctx)
            slots = (self.prefetch_factor or 2) + 3  # in flight + the batch you hold + the one before
            flags = ctx.Array("b", [1] * (self.num_workers * slots))
            ds._ring_flags = (flags, slots, not self._pinning)
            returns = _RingReturns(flags, slots)
        kwargs.setdefault("collate_fn", _as_is)  # keep tuples and numpy arrays as the dataset made them
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory, **kwargs)
        positions = self._positions
        it = iter(loader)
        try:
            for item, tag in it:
                positions[tag[0]] = (tag[1], tag[2], tag[3])
                if isinstance(item, _EndOfWorker):
                    continue
                if ds._ring_flags is not None:
                    if tag[4]:
                        item = returns.received(item, tag[0], tag[4])
                    item = _unwrap_small(item, self._pinning)
                    returns.collect()
                if ds.gpu_decode:
                    item = ds.finish(item)
                yield item
        finally:
            del it
        self._finished = True

    def __repr__(self) -> str:
        return f"Loader({len(self.dataset.urls)} shards, num_workers={self.num_workers}, epoch={self.epoch})"


def _as_is(item: Any) -> Any:
    return item


def _split_message(ds: ShardDataset, workers: int) -> str:
    _, world = ds._plan_rank_world()
    workers = workers if ds.split_by_worker else 1
    n = world * workers
    return (
        f"{len(ds.urls)} shards for {n} readers ({world} ranks x {workers} workers): splitting inside "
        f"shards, so some shards are read by several workers; use at least {n} shards for the best I/O"
    )
