"""Decode and encode sample entries by their extension.

A sample's entries are raw ``bytes`` keyed by extension (``"jpg"``, ``"seg.png"``, ``"json.gz"``).
The codec is picked by the LAST part of the extension, after a ``.gz`` suffix is stripped, so
``"seg.png"`` is a PNG and ``"json.gz"`` is gzip-compressed JSON (the key itself never changes).
Keys starting with ``__`` are metadata and pass through.

Rules worth knowing:

- Unknown extensions stay ``bytes``; values that are not ``bytes`` (already decoded) pass through.
- Pickle (``pyd``/``pickle``/``pkl``, object arrays in ``npy``/``npz``, full ``torch.load`` for ``pth``) is
  refused unless ``allow_pickle=True``: unpickling untrusted shards runs arbitrary code.
- Encoding: ``bytes`` pass through unchanged (even for ``.gz`` keys: they are taken as final), ``str``
  becomes UTF-8 for any extension, everything else goes through the extension's encoder. The output is
  a pure function of the input: no timestamps (gzip mtime=0, fixed zip dates), so reruns are
  byte-identical.
- JSON is written compact (``,`` and ``:``), UTF-8, keys in the dict's own order (not sorted: it keeps
  decoded-then-re-encoded JSON as it was, and Python dicts are ordered, so it is deterministic).
  numpy/torch scalars and arrays are converted to plain numbers/lists.
- Torch and simplejpeg are imported only when used; ``import shardflow.codecs`` needs neither.
- User codecs (``register_codec``) override builtins. A ``Decoder``/``Encoder`` takes a snapshot of the
  registered codecs when it is created and carries it when pickled, so worker processes see them.

Modules: ``registry`` (the extension rule, user codecs), ``decoder`` / ``encoder`` (the two
directions), ``images`` and ``values`` (the builtin codecs), ``tensors`` (torch without importing it),
``failures`` (stable error reasons). This module only re-exports.
"""

from __future__ import annotations

from shardflow.codecs.decoder import Decoder, decode_value
from shardflow.codecs.encoder import Encoder, encode_value
from shardflow.codecs.images import IMAGE_EXTENSIONS, IMAGE_SPECS, ImageOptions
from shardflow.codecs.registry import register_codec, split_extension, unregister_codec

# Run directories pickle Decoder/Encoder instances by reference (job.pkl). They keep the public
# path 0.1.0 used, `shardflow.codecs.<name>`, so a run directory written by any version loads
# whichever module defines the classes now; `_ImageOptions` is 0.1.0's name of ImageOptions.
for _cls in (Decoder, Encoder, ImageOptions):
    _cls.__module__ = __name__
del _cls
_ImageOptions = ImageOptions

__all__ = [
    "Decoder",
    "Encoder",
    "register_codec",
    "unregister_codec",
    "decode_value",
    "encode_value",
    "split_extension",
    "IMAGE_EXTENSIONS",
    "IMAGE_SPECS",
]
