"""Encoding sample entries by extension: `Encoder` (a whole sample) and `encode_value` (one entry).

``bytes`` (and storage.file_value.FileValue, a file streamed into the shard) pass through unchanged
(even for ``.gz`` keys: they are taken as final), ``str`` becomes
UTF-8 for any extension, everything else goes through the extension's encoder. The output is a pure
function of the input (gzip mtime=0, fixed zip dates), so reruns are byte-identical. JSON is written
compact, UTF-8, keys in the dict's own order (decoded-then-re-encoded JSON stays as it was).
"""

from __future__ import annotations

import gzip
from typing import Any, Mapping

from shardflow.codecs.failures import NoEncoder, describe_failure, type_name
from shardflow.codecs.images import IMAGE_EXTENSIONS, ImageOptions, encode_image
from shardflow.codecs.registry import EncodeFn, lookup, split_extension, user_encoders
from shardflow.codecs.values import VALUE_ENCODERS
from shardflow.errors import EncodeError, JobError
from shardflow.storage.file_value import FileValue
from shardflow.text import safe_repr


def encode_entry(ext: str, value: Any, opts: ImageOptions, codecs: Mapping[str, EncodeFn]) -> bytes | FileValue:
    """One entry's bytes: bytes as they are, else user codec, str, image, value codec; gzip for .gz.
    A FileValue (a large file a shell command left) is final bytes too: passed on unread, streamed by
    the shard writer."""
    if isinstance(value, FileValue):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    inner, last, gz = split_extension(ext)
    user = lookup(codecs, inner, last)
    if user is not None:
        data = user(value)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"registered encoder returned {type_name(data)}, not bytes")
        data = bytes(data)
    elif isinstance(value, str):
        data = value.encode("utf-8")
    elif last in IMAGE_EXTENSIONS:
        data = encode_image(last, value, opts)
    elif last in VALUE_ENCODERS:
        data = VALUE_ENCODERS[last](value)
    else:
        raise NoEncoder()
    return gzip.compress(data, compresslevel=6, mtime=0) if gz else data


def _encode_or_raise(
    ext: str, value: Any, opts: ImageOptions, codecs: Mapping[str, EncodeFn], url: Any, key: Any
) -> bytes | FileValue:
    try:
        return encode_entry(ext, value, opts, codecs)
    except NoEncoder:
        raise EncodeError(
            f"no encoder for extension {ext!r} and a value of type {type_name(value)}; "
            "return bytes or str for it, or register_codec() one",
            url=url,
            key=key,
        ) from None
    except Exception as e:
        raise EncodeError(
            f"cannot encode {type_name(value)} as {ext!r}: {describe_failure(e)}", url=url, key=key
        ) from e


def encode_value(
    ext: str,
    value: Any,
    *,
    jpeg_quality: int = 90,
    png_compress_level: int = 1,
    webp_quality: int = 90,
    png_deflate: str = "isal",
    url: str | None = None,
    key: str | None = None,
) -> bytes:
    """Encode one value for extension ``ext``; raises EncodeError naming url/key/ext/type."""
    opts = ImageOptions(jpeg_quality, png_compress_level, webp_quality, png_deflate)
    return _encode_or_raise(ext, value, opts, user_encoders(), url, key)


class Encoder:
    """Callable ``encoder(sample) -> dict`` of bytes ready for a tar writer.

    ``__key__`` is kept, other ``__*`` keys are dropped. PNG compress level defaults to 1: 1.1-3.7x
    faster than Pillow's default for files a little larger, the right trade for intermediate shards.
    8-bit L/RGB/RGBA PNGs are written by shardflow's writer (codecs.png): at levels 2-9 Pillow's bytes,
    ~1.5x faster than Pillow on noisy photos; at levels 0-1 with one fixed row filter (numpy only), 2-4x
    faster again than Pillow at that level, about the same size. At level 1
    it deflates with ``png_deflate``: ``"isal"`` (ISA-L, the default: 10-15x faster than zlib, no larger)
    or ``"zlib"`` (the bytes written before this option existed); a missing engine is an error, never replaced,
    so the bytes do not depend on what a worker happens to have (codecs.deflate). Otherwise encoding
    uses Pillow only (not simplejpeg), so the bytes do not depend on optional extras.
    """

    # The instance attributes (options, codecs) are what run directories of 0.1.0 pickled: keep
    # their names, or add __setstate__.

    def __init__(self, jpeg_quality: int = 90, png_compress_level: int = 1, webp_quality: int = 90,
                 png_deflate: str = "isal") -> None:
        self.options = ImageOptions(jpeg_quality, png_compress_level, webp_quality, png_deflate)
        self.codecs = dict(user_encoders())

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        key, url = sample.get("__key__"), sample.get("__url__")
        out: dict[str, Any] = {}
        if "__key__" in sample:
            out["__key__"] = key
        for k, v in sample.items():
            if not isinstance(k, str):  # the job's output, not its input: a JobError (task.process records it so)
                raise JobError(f"output entry name {safe_repr(k)} is {type_name(k)}: entry names must be str, the "
                               "extension to write it under (such as 'txt' or 'seg.png')", url=url, key=key)
            if not k.startswith("__"):  # final bytes go as encode_entry gives them back: no call per entry
                out[k] = v if type(v) is bytes else _encode_or_raise(k, v, self.options, self.codecs, url, key)
        return out
