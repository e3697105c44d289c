"""Which codec an extension selects: the extension rule, and the table of user codecs.

The codec is picked by the LAST part of the extension after a ``.gz`` suffix is stripped, so
``"seg.png"`` is a PNG and ``"json.gz"`` is gzip-compressed JSON; a user codec registered for the
whole inner extension (``"seg.png"``) wins over one for its last part. The reader uses the same rule
(`split_extension`) to tell which entries are images, so the two can never disagree.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

DecodeFn = Callable[[bytes], Any]
EncodeFn = Callable[[Any], bytes]

# Live tables: decode_value/encode_value read them on every call; Decoder/Encoder take a snapshot.
_user_decoders: dict[str, DecodeFn] = {}
_user_encoders: dict[str, EncodeFn] = {}


def register_codec(ext: str, decode: DecodeFn | None = None, encode: EncodeFn | None = None) -> None:
    """Add a codec for ``ext`` (``"foo"``, or a multi-part ``"seg.png"`` to match only that key).

    ``decode(bytes) -> obj`` and ``encode(obj) -> bytes``; either may be left out. It overrides the
    builtin for that extension in Decoders/Encoders created afterwards.
    """
    ext = norm_ext(ext)
    if decode is None and encode is None:
        raise ValueError("register_codec needs decode=, encode= or both")
    for fn in (decode, encode):
        if fn is not None and not callable(fn):
            raise TypeError(f"codec for {ext!r} must be callable, got {fn!r}")
    if decode is not None:
        _user_decoders[ext] = decode
    if encode is not None:
        _user_encoders[ext] = encode


def unregister_codec(ext: str) -> None:
    """Remove a user codec, so the builtin (if any) applies again."""
    ext = norm_ext(ext)
    _user_decoders.pop(ext, None)
    _user_encoders.pop(ext, None)


def user_decoders() -> Mapping[str, DecodeFn]:
    """The registered decoders (live, not a copy: copy it to take a snapshot)."""
    return _user_decoders


def user_encoders() -> Mapping[str, EncodeFn]:
    """The registered encoders (live, not a copy: copy it to take a snapshot)."""
    return _user_encoders


def norm_ext(ext: str) -> str:
    """``".JPG "`` -> ``"jpg"``: how users may spell an extension in arguments."""
    ext = ext.strip().lstrip(".").lower()
    if not ext:
        raise ValueError("extension must be non-empty")
    return ext


def split_extension(ext: str) -> tuple[str, str, bool]:
    """``"seg.png.gz"`` -> (``"seg.png"``, ``"png"``, True): inner extension, codec part, gzipped."""
    ext = ext.lower()
    gz = ext == "gz" or ext.endswith(".gz")
    inner = ext[:-3] if gz else ext
    return inner, inner.rpartition(".")[2], gz


def lookup(codecs: Mapping[str, Any], inner: str, last: str) -> Any:
    """The user codec for an entry: the one for its whole inner extension, else for its last part."""
    return codecs.get(inner) or codecs.get(last)
