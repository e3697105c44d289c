"""Writing shards: one tar (TarWriter) or numbered shards with rollover (ShardWriter), each committed
atomically (see storage.publish) with a receipt: URL, sample count, byte count and sha256.

Shards are opened only when their first sample arrives, so no empty shards are ever created.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Sequence

from shardflow.errors import ShardIOError
from shardflow.shards.committer import BackgroundCommitter
from shardflow.shards.formats import check_output_name, output_compression
from shardflow.shards.keys import Sample
from shardflow.shards.receipt import OneShard, ShardInfo
from shardflow.shards.record_write import RecordWriter
from shardflow.shards.records import record_format
from shardflow.shards.samples import sample_members
from shardflow.shards.sinks import HashingSink
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_write import TarStreamWriter, compress_stage
from shardflow.storage.file_value import FileValue
from shardflow.storage.publish import AtomicOutput, open_atomic
from shardflow.storage.schemes import open_write

# A sample with a member this large is hashed and written before TarWriter.write returns (see there).
_SETTLE_FROM = 4 << 20

__all__ = ["Encode", "ShardInfo", "ShardWriter", "TarWriter", "format_shard_name", "sample_tar_size"]

Encode = Callable[[Sample], Sample]


MIN_MAXSIZE = 3 * BLOCK  # the smallest shard ShardWriter writes: a header, a data block, the end blocks


class TarWriter(OneShard):
    """Write samples into one tar shard (a URL, committed atomically, or an open binary stream).

    `encoder` turns decoded values into bytes (see codecs.Encoder); without one every value must
    already be bytes. Use as a context manager: an exception inside the block aborts the shard.
    """

    def __init__(
        self,
        target: str | BinaryIO,
        *,
        storage_options: dict[str, Any] | None = None,
        encoder: Encode | None = None,
        mtime: int = 0,
        checksum: str | None = "sha256",
        temp_tag: str = "",
        allow_pipe: bool | None = None,
        threaded: bool = True,
        fsync: bool = True,
    ) -> None:
        self.url = target if isinstance(target, str) else str(getattr(target, "name", "<stream>"))
        if isinstance(target, str) and record_format(target):
            raise ValueError(f"{target!r} names a record-stream shard: write it with RecordWriter or ShardWriter")
        # the name says the compression (shards.formats); one shardflow cannot write is refused
        # (UnwritableName) before anything is opened, never written as a plain tar under that name
        compression = output_compression(self.url)
        self._atomic: AtomicOutput | None = None
        self._owned: Any = None  # a "-" or pipe: stream opened (and closed) here, not atomic
        if isinstance(target, str) and (target == "-" or target.startswith("pipe:")):
            self._owned = open_write(target, storage_options, allow_pipe=allow_pipe)
            out: Any = self._owned
        elif isinstance(target, str):
            out = self._atomic = open_atomic(target, storage_options, tag=temp_tag, fsync=fsync)
        else:
            out = target
        self._sink = HashingSink(out, checksum, threaded=threaded)
        # a compressed name gets what it says: the tar is compressed on the way to the sink (None: plain)
        self._stage = compress_stage(self._sink, compression)
        self._tar = TarStreamWriter(self._stage or self._sink, mtime=mtime)  # type: ignore[arg-type]
        self._encoder = encoder
        self.nsamples = 0
        self.closed = False

    def encoded_members(self, sample: Sample) -> list[tuple[str, bytes]]:
        """The (name, bytes) members `write(sample)` would add."""
        return sample_members(self._encoder(sample) if self._encoder else sample)

    def write(self, sample: Sample) -> int:
        """Add one sample; returns the tar bytes it took."""
        return self.write_members(self.encoded_members(sample))

    def write_members(self, members: list[tuple[str, bytes]]) -> int:
        """Add one sample given as its (name, bytes) members; returns the tar bytes it took."""
        if self.closed:
            raise ValueError(f"{self.url} is closed")
        before = self._tar.bytes_written
        large = False
        try:
            for name, data in members:
                self._tar.add(name, data)
                large = large or (len(data) >= _SETTLE_FROM and not isinstance(data, FileValue))
            if large and self._stage is None:
                # hashed and written before we return (add() handed it on: it is over the batch size),
                # so the caller's copy is the only one, freed before it reads the next sample
                # (issue 28.6: three 10 MB samples alive at once, else)
                self._sink.settle()
        except OSError as exc:
            raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
        self.nsamples += 1
        return self._tar.bytes_written - before

    def write_batch(self, batch: Sequence[list[tuple[str, bytes]]], maxsize: float) -> int:
        """Add samples given as their (name, bytes) members while the shard stays within `maxsize`
        bytes (an empty shard takes the first whatever its size); returns how many were added."""
        if self.closed:
            raise ValueError(f"{self.url} is closed")
        try:
            added = self._tar.add_samples(batch, maxsize)
        except OSError as exc:
            raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
        self.nsamples += added
        return added

    @property
    def nbytes(self) -> int:
        return self._tar.bytes_written

    def sample_size(self, members: list[tuple[str, bytes]]) -> int:
        """Bytes `write_members(members)` would add, plus the end-of-archive blocks."""
        return sample_tar_size(members) + 2 * BLOCK

    def close(self) -> ShardInfo:
        """Finish the archive and commit it; returns its receipt."""
        return self._close_after(self._finish)

    def _finish(self) -> None:
        self._tar.finish()
        if self._stage is not None:
            self._stage.finish()
            self._stage = None  # the compressor's state (xz: ~90 MB) is not kept with the receipt
        self._sink.drain()  # every byte hashed and handed to the output
        if self._owned is not None:
            self.closed = True
            self._owned.close()  # a failing pipe: command raises PipeError here

    def abort(self) -> None:
        """Throw the shard away (nothing appears under its name); safe to call more than once."""
        if not self.closed:
            self.closed = True
            self._sink.drain(discard=True)  # stop the writing thread before dropping its output
            if self._atomic is not None:
                self._atomic.abort()
            elif self._owned is not None:
                try:
                    self._owned.close()
                except (OSError, ShardIOError):
                    pass


def sample_tar_size(members: list[tuple[str, bytes]]) -> int:
    """Tar bytes a sample's members take, so ShardWriter can roll over before writing them."""
    return sum(TarStreamWriter.member_size(name, len(data)) for name, data in members)


def format_shard_name(pattern: str | Callable[[int], str], index: int) -> str:
    """Shard URL for `index`: a callable, a `{shard:06d}`-style format, or a `%06d` pattern."""
    if callable(pattern):
        return pattern(index)
    if "{" in pattern:
        return pattern.format(index, shard=index)
    return pattern % index


class ShardWriter:
    """Write a stream of samples into numbered shards with rollover.

    A new shard starts when the current one holds `maxcount` samples or when the next sample would
    push it past `maxsize` bytes of tar (so no shard exceeds maxsize unless one sample alone does).
    `fsync=False` skips the fsync of local shards on commit (still atomic, no longer durable across
    a power cut): for scratch output, or output that is copied elsewhere afterwards.
    """

    def __init__(
        self,
        pattern: str | Callable[[int], str],
        *,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        start_index: int = 0,
        storage_options: dict[str, Any] | None = None,
        encoder: Encode | None = None,
        mtime: int = 0,
        checksum: str | None = "sha256",
        on_commit: Callable[[ShardInfo], None] | None = None,
        temp_tag: str = "",
        fsync: bool = True,
        threaded: bool = True,
        background_commit: bool = True,
    ) -> None:
        if maxcount < 1 or maxsize < MIN_MAXSIZE:
            raise ValueError(f"maxcount must be >= 1 and maxsize >= {MIN_MAXSIZE} bytes")
        if isinstance(pattern, str):  # a name shardflow cannot write is refused now, not at the first sample
            check_output_name(format_shard_name(pattern, start_index))
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = int(maxsize)
        self.index = start_index
        self.shards: list[ShardInfo] = []
        self._options = storage_options
        self._encoder = encoder
        self._mtime = mtime
        self._checksum = checksum
        self._on_commit = on_commit
        self._temp_tag = temp_tag
        self._fsync = fsync
        self._threaded = threaded
        self._current: TarWriter | RecordWriter | None = None
        # Finished shards are committed by one background thread while the next one is written
        # (hides fsync and the final upload of object stores); receipts and on_commit calls are
        # delivered in order, in the caller's thread, at the next write() or at close().
        self._committer: BackgroundCommitter[ShardInfo] | None = BackgroundCommitter() if background_commit else None

    def write(self, sample: Sample) -> None:
        """Add one sample, starting a new shard first when it would not fit the current one."""
        if self._committer is not None and self._committer.has_news():
            self._deliver()
        members = sample_members(self._encoder(sample) if self._encoder else sample)
        current = self._current
        if current is not None and (
            current.nsamples >= self.maxcount or current.nbytes + current.sample_size(members) > self.maxsize
        ):
            self._finish_current()
            current = None
        if current is None:
            current = self._open_next()
        current.write_members(members)

    def write_batch(self, batch: Sequence[list[tuple[str, bytes]]]) -> None:
        """Add samples given as their (name, bytes) members, as sample_members() makes them (names
        `key.ext`, extensions sorted, all checked; no encoder applied): the same shards as write()
        sample by sample, for less per sample (`shardflow create` packs its reads this way)."""
        start = 0
        while start < len(batch):
            if self._committer is not None and self._committer.has_news():
                self._deliver()
            current = self._current
            if current is not None and current.nsamples >= self.maxcount:
                self._finish_current()
                current = None
            if current is None:
                current = self._open_next()
            added = current.write_batch(batch[start : start + self.maxcount - current.nsamples], self.maxsize)
            if not added:  # the next sample would push the shard past maxsize
                self._finish_current()
            start += added

    def _open_next(self) -> TarWriter | RecordWriter:
        url = format_shard_name(self.pattern, self.index)
        self.index += 1
        kind = RecordWriter if record_format(url) else TarWriter  # .cbors / .mps / .msgpacks: records
        self._current = kind(
            url, storage_options=self._options, mtime=self._mtime, checksum=self._checksum,
            temp_tag=self._temp_tag, fsync=self._fsync, threaded=self._threaded,
        )
        return self._current

    def _finish_current(self) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        if self._committer is not None:
            self._committer.submit(current)  # closed (drained, fsynced, renamed) in the background
        else:
            self._record(current.close())
        self._deliver()

    def _record(self, info: ShardInfo) -> None:
        self.shards.append(info)
        if self._on_commit is not None:
            self._on_commit(info)

    def _deliver(self) -> None:
        """Receipts of shards the background committer finished, in order (and its error)."""
        if self._committer is not None:
            for info in self._committer.take_done():
                self._record(info)
            self._committer.raise_error()

    def close(self) -> list[ShardInfo]:
        """Commit the shard in progress; returns receipts of every shard written."""
        if self._committer is not None and self._current is not None and not self._committer.started:
            # the last (often the only) shard: nothing to overlap its commit with, so it is committed
            # here, without starting the committer's thread (a task of tiny shards starts none)
            current, self._current = self._current, None
            self._record(current.close())
        self._finish_current()
        if self._committer is not None:
            self._committer.wait()
            self._committer.stop()
            self._deliver()
        return self.shards

    def abort(self) -> None:
        """Throw away the shard in progress (already finished shards are still committed)."""
        if self._current is not None:
            self._current.abort()
            self._current = None
        if self._committer is not None:
            self._committer.wait()
            self._committer.stop()
            for info in self._committer.take_done():
                self._record(info)

    def __del__(self) -> None:
        committer = getattr(self, "_committer", None)
        if committer is not None:
            committer.stop(join=False)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
