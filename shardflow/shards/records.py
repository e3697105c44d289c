"""Record-stream shards: samples stored as concatenated CBOR (`.cbors`) or MessagePack (`.mps`,
`.msgpacks`) items instead of tar members.

A tar member costs at least 1 KiB (a 512-byte header plus padding to 512 bytes), which dominates
samples of a few dozen bytes; a record costs its own bytes plus a few bytes of framing. Each item is
one sample: a map `{"__key__": "000017", "txt": b"...", "cls": 3}` (webdataset's cbors layout), or
an array mapped to names by `fields=` (`fields=("__key__", "txt", "cls")`). An item without a key
gets its index (`"000000017"`) as key.

Reading streams (one item in memory, at most MAX_ITEM bytes: nothing a length prefix claims is
allocated before it is read); a stream that ends inside an item is a FormatError naming the offset
and index of that item, raised after every complete item was yielded (like a truncated tar).
Writing (`encode_record`) puts `__key__` first and the other entries in sorted order, so the same
samples always give the same bytes.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from shardflow.errors import (
    DEFAULT_ON_ERROR_READ,
    FormatError,
    SampleError,
    ShardflowError,
    apply_policy,
    check_on_error,
)
from shardflow.shards.keys import Sample

# name suffix -> record format
RECORD_SUFFIXES = {".cbors": "cbor", ".mps": "msgpack", ".msgpacks": "msgpack"}
MAX_ITEM = 256 << 20  # the largest item a reader holds (msgpack's buffer; cbor reads in 64 KiB steps)
_CHUNK = 1 << 20

ErrorSink = Callable[[ShardflowError], None]

__all__ = ["RECORD_SUFFIXES", "encode_record", "iter_records", "read_records", "record_format", "value_bytes"]


def record_format(url: str) -> str | None:
    """'cbor' or 'msgpack' when `url` names a record-stream shard by its suffix, else None."""
    path = url.split("?", 1)[0].lower()
    for suffix, fmt in RECORD_SUFFIXES.items():
        if path.endswith(suffix):
            return fmt
    return None


def encode_record(sample: Sample, fmt: str) -> bytes:
    """One item: `__key__` first, then every non-metadata entry in sorted order (values as they are:
    bytes, or anything the format can hold)."""
    item: dict[str, Any] = {"__key__": sample["__key__"]}
    for name in sorted(sample):
        if not name.startswith("__"):
            item[name] = sample[name]
    try:
        if fmt == "cbor":
            import cbor2

            return cbor2.dumps(item)
        import msgpack

        return msgpack.packb(item, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SampleError(f"cannot write as {fmt}: {exc}", key=str(sample.get("__key__"))) from exc


def value_bytes(value: Any) -> bytes:
    """A record entry as bytes: bytes as they are, text as UTF-8, numbers and the rest as JSON-ish text
    (how `shardflow cat` prints an entry that a record stores as a native value)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    try:
        return repr(value).encode()
    except ValueError:  # an int of more than sys.get_int_max_str_digits() digits (a CBOR bignum): hex is exact
        if isinstance(value, int):
            return hex(value).encode()
        return f"<{type(value).__name__} holding an integer too long to print in decimal>".encode()


def member_sizes(sample: Sample) -> tuple[dict[str, int], dict[str, str]]:
    """(ext -> bytes, ext -> type name of each native value) of a sample, for listings: a record
    stream stores ints, floats, lists as they are; their size is that of the text `value_bytes` gives."""
    sizes, natives = {}, {}
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if not isinstance(value, (bytes, bytearray, memoryview)):
            natives[ext] = type(value).__name__
        sizes[ext] = len(value_bytes(value))
    return sizes, natives


def _brief(value: Any) -> str:
    """A short repr of a data value for a message: never the whole of a long one, never an error
    (repr of an int over 4,300 digits raises ValueError: that failed the shard without a name)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<int of {value.bit_length()} bits>"
    try:
        plain = isinstance(value, (str, bytes, int, float, bool, type(None)))
        text = repr(value) if plain else f"<{type(value).__name__}>"
    except ValueError:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


class _CountingRaw(io.RawIOBase):
    """A raw stream over `source` that knows how many bytes it gave (its tell())."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        return n

    def tell(self) -> int:
        return self.count


def _cbor_items(stream: BinaryIO, url: str) -> Iterator[tuple[int, Any]]:
    """(offset, item) of each CBOR item; truncation or garbage raise FormatError naming the item."""
    import cbor2

    buffered = io.BufferedReader(_CountingRaw(stream), _CHUNK)
    decoder = cbor2.CBORDecoder(buffered)
    index = 0
    while True:
        offset = buffered.tell()
        try:
            item = decoder.decode()
        except cbor2.CBORDecodeEOF as exc:
            if buffered.tell() == offset:
                return  # a clean end: no byte of a next item
            raise FormatError(f"truncated record stream: item {index} is cut off ({exc})",
                              url=url, offset=offset) from None
        except (cbor2.CBORDecodeError, ValueError, RecursionError) as exc:
            raise FormatError(f"corrupt CBOR item {index}: {exc}", url=url, offset=offset) from None
        yield offset, item
        index += 1


def _msgpack_items(stream: BinaryIO, url: str) -> Iterator[tuple[int, Any]]:
    """(offset, item) of each MessagePack item, fed in 1 MiB chunks."""
    import msgpack

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=MAX_ITEM)
    fed = index = done = 0  # done: where the last complete item ended (tell() moves on inside a cut one)
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        try:
            unpacker.feed(chunk)
        except msgpack.BufferFull:
            raise FormatError(f"record item {index} is larger than {MAX_ITEM} bytes", url=url, offset=done) from None
        fed += len(chunk)
        while True:
            try:
                item = unpacker.unpack()
            except msgpack.OutOfData:
                break
            except (ValueError, msgpack.UnpackException) as exc:
                raise FormatError(f"corrupt MessagePack item {index}: {exc}", url=url, offset=done) from None
            yield done, item
            done = unpacker.tell()
            index += 1
    if done < fed:
        raise FormatError(f"truncated record stream: item {index} is cut off ({fed - done} bytes of it at the end)",
                          url=url, offset=done)


def _to_sample(item: Any, index: int, offset: int, url: str, fields: Sequence[str] | None) -> Sample:
    """The sample of one item (a map, or an array named by `fields`)."""
    if isinstance(item, (list, tuple)):
        if fields is None:
            raise SampleError(f"item {index} is an array: name its entries with fields=", url=url, offset=offset)
        if len(item) != len(fields):
            raise SampleError(f"item {index} has {len(item)} entries, fields= names {len(fields)}",
                              url=url, offset=offset)
        item = dict(zip(fields, item))
    if not isinstance(item, dict):
        raise SampleError(f"item {index} is a {type(item).__name__}, not a map of a sample", url=url, offset=offset)
    key = item.get("__key__", f"{index:09d}")
    if not isinstance(key, str) or not key:
        raise SampleError(f"item {index} has a bad __key__ {_brief(key)}", url=url, offset=offset)
    sample: Sample = {"__key__": key, "__url__": url}
    for name, value in item.items():
        if not isinstance(name, str) or not name:
            raise SampleError(f"item {index} has a bad entry name {_brief(name)}", url=url, key=key, offset=offset)
        if not name.startswith("__"):
            sample[name.lower()] = value
    return sample


def iter_records(stream: BinaryIO, url: str = "", *, fmt: str | None = None, fields: Sequence[str] | None = None,
                 on_error: str = DEFAULT_ON_ERROR_READ, report: ErrorSink | None = None) -> Iterator[Sample]:
    """Samples of one open record stream (`fmt` from the URL's suffix unless given).

    A bad item (not a map, no usable key) is a SampleError under `on_error`; truncation and corrupt
    framing end the stream with FormatError in every mode (nothing after them can be found again)."""
    check_on_error(on_error)
    fmt = fmt or record_format(url)
    if fmt not in ("cbor", "msgpack"):
        raise ValueError(f"not a record stream: {url!r} (suffixes: {', '.join(RECORD_SUFFIXES)})")
    items = _cbor_items(stream, url) if fmt == "cbor" else _msgpack_items(stream, url)
    seen: set[str] = set()
    for index, (offset, item) in enumerate(items):
        try:
            sample = _to_sample(item, index, offset, url, fields)
            if sample["__key__"] in seen:
                raise SampleError(f"item {index}: key reappears in the shard", url=url, key=sample["__key__"],
                                  offset=offset)
        except SampleError as exc:
            apply_policy(exc, on_error, report)
            continue
        seen.add(sample["__key__"])
        yield sample


def read_records(source: BinaryIO | str, url: str = "", *, fields: Sequence[str] | None = None,
                 on_error: str = DEFAULT_ON_ERROR_READ, report: ErrorSink | None = None,
                 storage_options: dict[str, Any] | None = None, allow_pipe: bool | None = None) -> Iterator[Sample]:
    """Samples of one record shard: an open stream, or a URL opened (and closed) here."""
    if not isinstance(source, str):
        return iter_records(source, url, fields=fields, on_error=on_error, report=report)
    return _read_url(source, fields, on_error, report, storage_options, allow_pipe)


def _read_url(url: str, fields: Sequence[str] | None, on_error: str, report: ErrorSink | None,
              storage_options: dict[str, Any] | None, allow_pipe: bool | None) -> Iterator[Sample]:
    from shardflow.storage.schemes import open_read

    stream = open_read(url, storage_options, allow_pipe=allow_pipe)
    try:
        yield from iter_records(stream, url, fields=fields, on_error=on_error, report=report)
    finally:
        stream.close()
