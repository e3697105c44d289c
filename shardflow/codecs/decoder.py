"""Decoding sample entries by extension: `Decoder` (a whole sample) and `decode_value` (one entry).

Unknown extensions stay ``bytes``; values that are not ``bytes`` (already decoded) and ``__`` keys
pass through. A Decoder snapshots the registered user codecs when it is made and carries them when
pickled, so worker processes decode exactly as the driver that made it.
"""

from __future__ import annotations

import functools
import gzip
from typing import Any, Callable, Iterable, Mapping

from shardflow.codecs.failures import describe_failure
from shardflow.codecs.images import IMAGE_EXTENSIONS, IMAGE_SPECS, check_spec, decode_image
from shardflow.codecs.registry import DecodeFn, lookup, norm_ext, split_extension, user_decoders
from shardflow.codecs.tensors import import_torch
from shardflow.codecs.values import PICKLING_DECODERS, VALUE_DECODERS
from shardflow.errors import DecodeError


def decode_entry(
    ext: str, data: bytes, spec: str, allow_pickle: bool, fast_jpeg: bool, codecs: Mapping[str, DecodeFn]
) -> Any:
    """One entry's value: user codec first, then images, plain values, pickling formats; else bytes."""
    return entry_decoder(ext, spec, allow_pickle, fast_jpeg, codecs)(data)


def entry_decoder(
    ext: str, spec: str, allow_pickle: bool, fast_jpeg: bool, codecs: Mapping[str, DecodeFn]
) -> Callable[[bytes], Any]:
    """The function that decodes entries with extension `ext` (decode_entry's choice, made once)."""
    inner, last, gz = split_extension(ext)
    fn: Callable[[bytes], Any] | None = lookup(codecs, inner, last)
    if fn is None and last in IMAGE_EXTENSIONS:
        fn = functools.partial(decode_image, spec=spec, last=last, fast_jpeg=fast_jpeg)
    if fn is None:
        fn = VALUE_DECODERS.get(last)
    if fn is None and last in PICKLING_DECODERS:
        fn = functools.partial(PICKLING_DECODERS[last], allow_pickle=allow_pickle)
    if fn is None:
        fn = _as_is
    return functools.partial(_gunzip_then, fn) if gz else fn


def _gunzip_then(fn: Callable[[bytes], Any], data: bytes) -> Any:
    return fn(gzip.decompress(data))


def _as_is(data: bytes) -> bytes:
    return data


def decode_value(
    ext: str,
    data: bytes,
    spec: str | None = "rgb",
    allow_pickle: bool = False,
    *,
    fast_jpeg: bool = True,
    url: str | None = None,
    key: str | None = None,
) -> Any:
    """Decode one entry's bytes as its extension says; ``spec=None`` returns the bytes as they are.

    Raises DecodeError (naming url/key/ext when given) chained from the underlying error.
    """
    check_spec(spec)
    if spec is None or not isinstance(data, (bytes, bytearray, memoryview)):
        return data
    try:
        return decode_entry(ext, bytes(data), spec, allow_pickle, fast_jpeg, user_decoders())
    except Exception as e:
        raise DecodeError(f"cannot decode {ext!r}: {describe_failure(e)}", url=url, key=key) from e


class Decoder:
    """Callable ``decoder(sample) -> dict`` that decodes every entry by its extension.

    ``spec`` is the image spec (see IMAGE_SPECS; ``None`` leaves every value raw). ``only`` (a set of
    extensions, or a space-separated string) restricts decoding: an entry is decoded when its full
    extension, that extension without ``.gz``, or its last part is listed; the rest stay bytes, so a
    job that needs only json does not pay for decoding images. ``fast_jpeg`` uses simplejpeg (when
    installed, about 1.3x faster than Pillow) for RGB JPEG specs.
    """

    # The instance attributes (spec, allow_pickle, only, fast_jpeg, codecs) are what run directories
    # of 0.1.0 pickled: keep their names, or add __setstate__.

    def __init__(
        self,
        spec: str | None = "rgb",
        allow_pickle: bool = False,
        only: Iterable[str] | str | None = None,
        *,
        fast_jpeg: bool = True,
    ) -> None:
        check_spec(spec)
        if spec is not None and IMAGE_SPECS[spec][0] == "torch":
            import_torch()  # fail now with a clear message, not on the first image of a shard
        if isinstance(only, str):
            only = only.split()
        self.spec = spec
        self.allow_pickle = allow_pickle
        self.only = None if only is None else frozenset(norm_ext(e) for e in only)
        self.fast_jpeg = fast_jpeg
        self.codecs = dict(user_decoders())

    def wants(self, ext: str) -> bool:
        """Whether this decoder decodes entries with extension ``ext``."""
        if self.spec is None:
            return False
        if self.only is None:
            return True
        inner, last, _ = split_extension(ext)
        return ext in self.only or inner in self.only or last in self.only

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        spec = self.spec
        if spec is None:
            return dict(sample)
        routes = self._routes()
        out: dict[str, Any] = {}
        for k, v in sample.items():
            fn = routes.get(k, _UNSEEN)
            if fn is _UNSEEN:
                fn = self._route(k)
                if len(routes) < _MAX_ROUTES:
                    routes[k] = fn
            if fn is None or not isinstance(v, (bytes, bytearray, memoryview)):
                out[k] = v
                continue
            try:
                out[k] = fn(bytes(v))
            except Exception as e:
                url, key = sample.get("__url__"), sample.get("__key__")
                raise DecodeError(f"cannot decode {k!r}: {describe_failure(e)}", url=url, key=key) from e
        return out

    def _route(self, k: str) -> Callable[[bytes], Any] | None:
        """How entries named `k` are decoded (None: kept as they are)."""
        if k.startswith("__") or not self.wants(k):
            return None
        return entry_decoder(k, self.spec, self.allow_pickle, self.fast_jpeg, self.codecs)  # type: ignore[arg-type]

    def _routes(self) -> dict[str, Any]:
        """Entry name -> its decode function, found once per name (the choice is a few string
        operations and lookups: per sample and field that showed in the reader's profile)."""
        routes = self.__dict__.get("_route_cache")
        if routes is None:
            routes = self.__dict__["_route_cache"] = {}
        return routes

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_route_cache", None)  # functions of this process (some are lambdas): made again
        return state


_UNSEEN = object()
_MAX_ROUTES = 1024  # entry names cached per Decoder; a dataset with more names decides the rest each time
