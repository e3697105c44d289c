"""Non-image entries: numbers, text, JSON, msgpack, CBOR, numpy, torch and pickle.

Pickle (``pyd``/``pickle``/``pkl``, object arrays in ``npy``/``npz``, full ``torch.load`` for ``pth``) is
refused unless ``allow_pickle=True``: unpickling untrusted shards runs arbitrary code, so those
decoders take the flag and the others cannot even see it. Every encoder is a pure function of the
value (fixed zip dates, no timestamps), so reruns are byte-identical.
"""

from __future__ import annotations

import io
import json
import operator
import pickle
import zipfile
from typing import Any, Callable, Mapping

import numpy as np

from shardflow.codecs.failures import Refused
from shardflow.codecs.tensors import as_array, import_torch, is_tensor

_INT_EXTS = frozenset({"cls", "cls2", "index", "id", "inx"})
_TEXT_EXTS = frozenset({"txt", "text", "transcript"})
_PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})  # webdataset decodes all three


# ----------------------------------------------------------------------------------------- decoding


def _decode_int(data: bytes) -> int:
    return int(data)


def _decode_npy(data: bytes, allow_pickle: bool) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=allow_pickle)


def _decode_npz(data: bytes, allow_pickle: bool) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=allow_pickle) as z:
        return {name: z[name] for name in z.files}


def _decode_msgpack(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(data, raw=False)


def _decode_cbor(data: bytes) -> Any:
    import cbor2

    return cbor2.loads(data)


def _decode_pth(data: bytes, allow_pickle: bool) -> Any:
    torch = import_torch()
    return torch.load(io.BytesIO(data), weights_only=not allow_pickle, map_location="cpu")


def _decode_pickle(data: bytes, allow_pickle: bool) -> Any:
    if not allow_pickle:
        raise Refused(
            "pickle decoding is off because unpickling untrusted data can run arbitrary code; "
            "pass allow_pickle=True (Decoder / ShardJob / ShardDataset) for shards you trust"
        )
    return pickle.loads(data)


# extension (its last part) -> decode(bytes)
VALUE_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **{e: _decode_int for e in _INT_EXTS},
    **{e: (lambda d: d.decode("utf-8")) for e in _TEXT_EXTS},
    "json": json.loads,
    "jsn": json.loads,
    "msgpack": _decode_msgpack,
    "mp": _decode_msgpack,
    "msg": _decode_msgpack,
    "cbor": _decode_cbor,
}
# extension -> decode(bytes, allow_pickle): the formats that can carry pickles
PICKLING_DECODERS: dict[str, Callable[[bytes, bool], Any]] = {
    "npy": _decode_npy,
    "npz": _decode_npz,
    "pth": _decode_pth,
    **{e: _decode_pickle for e in _PICKLE_EXTS},
}


# ----------------------------------------------------------------------------------------- encoding


def _plain(value: Any) -> Any:
    """numpy/torch scalars and arrays as plain Python values, for json/msgpack/cbor."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if is_tensor(value):
        return value.detach().cpu().tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not serializable")


def _encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_plain).encode("utf-8")


def _encode_int(value: Any) -> bytes:
    return str(operator.index(value)).encode("ascii")


def _npy_bytes(value: Any) -> bytes:
    buf = io.BytesIO()
    np.save(buf, as_array(value), allow_pickle=False)
    return buf.getvalue()


def _encode_npz(value: Any) -> bytes:
    """Like np.savez, but with fixed zip dates: np.savez stamps the current time into the bytes."""
    if not isinstance(value, Mapping):
        raise TypeError("npz needs a dict of name -> array")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in value.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.create_system = 3
            info.external_attr = 0o644 << 16
            zf.writestr(info, _npy_bytes(arr))
    return buf.getvalue()


def _encode_msgpack(value: Any) -> bytes:
    import msgpack

    return msgpack.packb(value, use_bin_type=True, default=_plain)


def _encode_cbor(value: Any) -> bytes:
    import cbor2

    return cbor2.dumps(value, default=lambda enc, v: enc.encode(_plain(v)))


def _encode_pth(value: Any) -> bytes:
    torch = import_torch()
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _encode_pickle(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


# extension (its last part) -> encode(value)
VALUE_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    **{e: _encode_int for e in _INT_EXTS},
    "json": _encode_json,
    "jsn": _encode_json,
    "npy": _npy_bytes,
    "npz": _encode_npz,
    "msgpack": _encode_msgpack,
    "mp": _encode_msgpack,
    "msg": _encode_msgpack,
    "cbor": _encode_cbor,
    "pth": _encode_pth,
    **{e: _encode_pickle for e in _PICKLE_EXTS},
}
