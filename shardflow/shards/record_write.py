"""RecordWriter: one record-stream shard (`.cbors`, `.mps`, `.msgpacks`), committed atomically with
a receipt, with the interface of TarWriter so ShardWriter rolls over either kind the same way."""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Sequence

from shardflow.errors import SampleError, ShardIOError
from shardflow.shards.keys import Sample, check_key, split_name
from shardflow.shards.receipt import OneShard, ShardInfo
from shardflow.shards.records import encode_record, record_format
from shardflow.shards.sinks import HashingSink
from shardflow.shards.tar_write import coalesce
from shardflow.storage.publish import AtomicOutput, open_atomic

BATCH_BYTES = 1 << 20


class RecordWriter(OneShard):
    """Write samples as concatenated CBOR / MessagePack items into one shard (a URL, committed
    atomically, or an open binary stream). Values may be bytes or anything the format holds."""

    def __init__(self, target: str | BinaryIO, *, storage_options: dict[str, Any] | None = None,
                 encoder: Callable[[Sample], Sample] | None = None, fmt: str | None = None,
                 checksum: str | None = "sha256", temp_tag: str = "", threaded: bool = True,
                 fsync: bool = True, **_tar_only: Any) -> None:
        self.url = target if isinstance(target, str) else str(getattr(target, "name", "<stream>"))
        self.fmt = fmt or record_format(self.url)
        if self.fmt not in ("cbor", "msgpack"):
            raise ValueError(f"{self.url!r} is not a record-stream name; pass fmt='cbor' or 'msgpack'")
        self._atomic: AtomicOutput | None = None
        out: Any = target
        if isinstance(target, str):
            out = self._atomic = open_atomic(target, storage_options, tag=temp_tag, fsync=fsync)
        self._sink = HashingSink(out, checksum, threaded=threaded)
        self._encoder = encoder
        self._pending: tuple[Any, bytes] | None = None  # (members, item) of the last sample_size()
        self._batch: list[bytes] = []  # items not yet handed to the sink (~1 MiB at a time, like tar)
        self._batch_bytes = 0
        self.nsamples = 0
        self.closed = False

    @property
    def nbytes(self) -> int:
        return self._sink.nbytes + self._batch_bytes

    def _flush_batch(self) -> None:
        if self._batch:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            self._sink.write_parts(coalesce(batch))  # small records joined: few pieces for the hashing thread

    def _item(self, members: list[tuple[str, bytes]]) -> bytes:
        if self._pending is not None and self._pending[0] is members:
            return self._pending[1]
        key = split_name(members[0][0])[0]
        skip = len(key) + 1
        sample: Sample = {"__key__": key}
        for name, data in members:
            # members of one sample: f"{key}.{ext}" (sample_members); a record holds a file whole
            sample[name[skip:]] = data if isinstance(data, bytes) else bytes(data)
        return encode_record(sample, self.fmt)  # type: ignore[arg-type]

    def sample_size(self, members: list[tuple[str, bytes]]) -> int:
        """Bytes `write_members(members)` adds (ShardWriter asks before writing, to roll over)."""
        item = self._item(members)
        self._pending = (members, item)
        return len(item)

    def write(self, sample: Sample) -> int:
        """Add one sample (its values as they are); returns the bytes it took."""
        sample = self._encoder(sample) if self._encoder else sample
        why = check_key(sample.get("__key__"))
        if why:
            raise SampleError(why)
        return self._add(encode_record(sample, self.fmt))  # type: ignore[arg-type]

    def write_members(self, members: list[tuple[str, bytes]]) -> int:
        """Add one sample given as its (name, bytes) members (what ShardWriter hands over)."""
        item = self._item(members)
        self._pending = None
        return self._add(item)

    def write_batch(self, batch: Sequence[list[tuple[str, bytes]]], maxsize: float) -> int:
        """Add samples given as their members while the shard stays within `maxsize` bytes (an
        empty shard takes the first whatever its size); returns how many were added."""
        added = 0
        for members in batch:
            if self.nsamples and self.nbytes + self.sample_size(members) > maxsize:
                break
            self.write_members(members)
            added += 1
        return added

    def _add(self, item: bytes) -> int:
        if self.closed:
            raise ValueError(f"{self.url} is closed")
        self._batch.append(item)
        self._batch_bytes += len(item)
        if self._batch_bytes >= BATCH_BYTES:
            try:
                self._flush_batch()
            except OSError as exc:
                raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
        self.nsamples += 1
        return len(item)

    def close(self) -> ShardInfo:
        """Flush and commit the shard; returns its receipt."""
        return self._close_after(self._finish)

    def _finish(self) -> None:
        self._flush_batch()
        self._sink.drain()

    def abort(self) -> None:
        """Throw the shard away (nothing appears under its name); safe to call more than once."""
        if not self.closed:
            self.closed = True
            self._batch, self._batch_bytes = [], 0
            self._sink.drain(discard=True)
            if self._atomic is not None:
                self._atomic.abort()
