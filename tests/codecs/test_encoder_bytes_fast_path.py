"""Encoder's fast path for values that are already bytes (issue 28 item 3): the same output as
encode_entry gives each of them: the object itself, never a registered codec, never gzip (bytes are
final even under .gz), '__' metadata dropped but `__key__` kept, the sample's order; bytes-like values
that are not exactly bytes still go through encode_entry and come out as plain bytes."""

from __future__ import annotations

from shardflow.codecs import Encoder, register_codec, unregister_codec
from shardflow.codecs.encoder import encode_entry
from shardflow.codecs.images import ImageOptions


class Tagged(bytes):
    """A bytes subclass: written as plain bytes, as encode_entry makes it."""


def test_bytes_values_pass_as_they_are_and_metadata_is_dropped():
    raw, gz = b"\x00raw", b"not gzip at all"
    sample = {"bin": raw, "__url__": "u", "__meta__": b"never written", "__key__": "k", "m.json.gz": gz,
              "ba": bytearray(b"ba"), "mv": memoryview(b"mv"), "tag": Tagged(b"t"), "txt": "text", "cls": 3}
    out = Encoder()(sample)
    assert list(out) == ["__key__", "bin", "m.json.gz", "ba", "mv", "tag", "txt", "cls"]
    assert out["bin"] is raw and out["m.json.gz"] is gz  # not copied, not gzipped
    assert out == {"__key__": "k", "bin": raw, "m.json.gz": gz, "ba": b"ba", "mv": b"mv", "tag": b"t",
                   "txt": b"text", "cls": b"3"}
    assert all(type(v) is bytes for k, v in out.items() if k != "__key__")  # Tagged(b"t") too
    opts = ImageOptions(90, 1, 90, "isal")
    for ext in ("bin", "m.json.gz", "ba", "mv", "tag", "txt", "cls"):
        assert out[ext] == encode_entry(ext, sample[ext], opts, {})


def test_a_registered_codec_never_applies_to_bytes():
    register_codec("up", encode=lambda v: v.upper().encode())
    try:
        encoder = Encoder()
        assert encoder({"__key__": "k", "up": b"raw"})["up"] == b"raw"
        assert encoder({"__key__": "k", "up": "str"})["up"] == b"STR"
    finally:
        unregister_codec("up")
