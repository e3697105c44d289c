"""One raw sample -> what the user asked for: decode, map, select fields (to_tuple).

Two shortcuts keep images cheap. With a torch uint8 spec and the default collate, images are
decoded to numpy HWC arrays and left as HWCImage, so collate writes them into the batch tensor in one
copy; with torchrgb8 the main JPEG field is even decoded straight into its row of the batch
(PlacedImage, see place.py). With GPU decode, JPEGs stay encoded (RawJpeg) and are decoded in
batches in the main process.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from shardflow.codecs import IMAGE_EXTENSIONS, Decoder, split_extension
from shardflow.errors import DecodeError, SampleError, SkipSample
from shardflow.reader.place import ImagePlacer
from shardflow.reader.seeding import call_seeded
from shardflow.reader.settings import Fields, ReaderSettings
from shardflow.reader.state import ErrorCount
from shardflow.reader.values import HWCImage, RawJpeg

JPEG_EXTENSIONS = frozenset({"jpg", "jpeg"})
# torch uint8 specs whose batches are built straight from the numpy decode (one copy into the batch)
FAST_SPECS = {"torchrgb8": "rgb8", "torchrgba8": "rgba8", "torchl8": "l8"}


class SampleDecoders(NamedTuple):
    """A dataset's decoders, made once when it is created (a Decoder snapshots the registered codecs)."""

    full: Decoder | None  # the decode spec as asked (None: raw bytes)
    fast: Decoder | None  # the numpy twin of a torch uint8 spec, for the batch fast path

    @classmethod
    def create(cls, s: ReaderSettings) -> SampleDecoders:
        full = Decoder(s.decode, allow_pickle=s.allow_pickle, only=s.only) if s.decode is not None else None
        fast = s.decode in FAST_SPECS and s.batch_size is not None and s.map is None and s.collate_fn is None
        return cls(full, Decoder(FAST_SPECS[s.decode], allow_pickle=s.allow_pickle, only=s.only) if fast else None)

    @property
    def placeable(self) -> bool:
        """Can JPEGs be decoded straight into the batch (RGB through simplejpeg, see place.py)?"""
        return self.fast is not None and self.fast.spec == "rgb8" and self.fast.fast_jpeg


class SamplePreparer:
    """Decodes, maps and selects the fields of raw samples; problems go to the error count."""

    def __init__(
        self,
        decoders: SampleDecoders,
        map: Callable[[dict[str, Any]], Any] | None,  # noqa: A002 (ShardDataset's name)
        to_tuple: Fields | None,
        errors: ErrorCount,
        gpu_defer: bool,
        placer: ImagePlacer | None = None,
        seed: int = 0,  # the epoch's seed (seeding.epoch_seed): what map= draws derives from it and the key
    ) -> None:
        self.decoder = decoders.full
        self.fast = decoders.fast if not gpu_defer else None
        self.placer = placer  # made by the dataset only where placing applies (placeable, no GPU decode)
        self.map = map
        self.to_tuple = to_tuple
        self.errors = errors
        self.gpu_defer = gpu_defer
        self.seed = seed
        self.key: str | None = None  # the key of the last sample prepared (a user collate_fn's batch seed)
        self._image_memo: dict[tuple[str, bool], bool] = {}

    def __call__(self, raw: dict[str, Any]) -> Any:
        """The sample as the user gets it; None when it is dropped (map) or skipped (error policy)."""
        self.key = key = raw.get("__key__")
        try:
            sample = self._decode(raw)
            if self.map is not None:
                sample = call_seeded(self.map, sample, self.seed, key)
                if sample is None:
                    return None
            if self.to_tuple is not None:
                sample = select_fields(sample, self.to_tuple)
            return sample
        except DecodeError as exc:
            self.errors.handle(exc)
        except SkipSample as exc:
            self.errors.handle(
                SampleError(f"skipped by map: {exc.reason}", url=raw.get("__url__"), key=raw.get("__key__"))
            )
        return None

    def _decode(self, raw: dict[str, Any]) -> dict[str, Any]:
        sample = raw
        jpegs = None
        if self.gpu_defer and self.decoder is not None:
            jpegs = {k: RawJpeg(v) for k, v in raw.items()
                     if isinstance(v, (bytes, bytearray)) and self._is_image(k, self.decoder, True)}
            if jpegs:
                sample = {k: v for k, v in raw.items() if k not in jpegs}
        if self.fast is not None:
            if self.placer is not None:
                sample = self._place(sample)
            sample = self.fast(sample)
            for k, v in sample.items():
                if type(v) is np.ndarray and v.dtype == np.uint8 and v.ndim in (2, 3) \
                        and self._is_image(k, self.fast, False):
                    sample[k] = HWCImage(v)
        elif self.decoder is not None:
            sample = self.decoder(sample)
        if jpegs:
            sample.update(jpegs)
        return sample

    def _place(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The sample with its main JPEG decoded into the batch (a PlacedImage the decoder passes
        through), when the placer can; else as it was."""
        placer = self.placer
        key = placer.key  # type: ignore[union-attr]
        if key is None:
            key = next((k for k, v in raw.items() if isinstance(v, (bytes, bytearray, memoryview))
                        and self._is_image(k, self.fast, True) and not split_extension(k)[2]), None)
            if key is None:
                return raw
        data = raw.get(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return raw
        placed = placer.place(key, data)  # type: ignore[union-attr]
        if placed is None:
            return raw
        sample = dict(raw)
        sample[key] = placed
        return sample

    def _is_image(self, key: str, decoder: Decoder, jpeg_only: bool) -> bool:
        """Is `key` an image entry this decoder decodes with a builtin codec (memoised per key)?"""
        answer = self._image_memo.get((key, jpeg_only))
        if answer is None:
            _, last, _ = split_extension(key)
            answer = (not key.startswith("__") and last in (JPEG_EXTENSIONS if jpeg_only else IMAGE_EXTENSIONS)
                      and decoder.wants(key) and not _user_codec(decoder, key))
            self._image_memo[(key, jpeg_only)] = answer
        return answer


def select_fields(sample: dict[str, Any], fields: Fields) -> tuple[Any, ...]:
    """to_tuple: per output field, the first of its entries the sample has."""
    out = []
    for choices in fields:
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


def _user_codec(decoder: Decoder, ext: str) -> bool:
    """Does a registered codec (which wins over the builtins) handle `ext`?"""
    inner, last, _ = split_extension(ext)
    codecs = getattr(decoder, "codecs", {})
    return inner in codecs or last in codecs
