"""Writing shards: atomic commit, rollover by count and size, a receipt per shard.

A shard appears under its final name only when it is complete:
- local files are written to a hidden temp name in the same directory, fsynced and renamed;
- object stores (s3, gs, azure, ... any fsspec AbstractBufferedFile) stream to the final key and the
  multipart/resumable upload is completed only by a clean close, and aborted on error;
- other filesystems (memory://, ...) are written to a temp name and moved.
Shards are opened only when their first sample arrives, so no empty shards are ever created.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
import zlib
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, Callable

from fsspec.spec import AbstractBufferedFile

from . import remote, urls
from .errors import ShardIOError
from .samples import Sample, sample_members
from .tario import BLOCK, TarStreamWriter

TEMP_MARK = ".tmp-"
# Object stores whose fsspec files upload on close() and can abort instead (discard()).
STREAMING_UPLOAD_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss"})


@dataclass(frozen=True)
class ShardInfo:
    """Receipt of a committed shard."""

    url: str
    nsamples: int
    nbytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def temp_name(url: str, tag: str = "") -> str:
    """Hidden sibling name used while `url` is being written (recognisable for clean-up).

    `tag` (e.g. a task id) lets a rerun delete exactly the temps of one task and no others.
    """
    head, _, base = url.rpartition("/")
    name = f".{base}{TEMP_MARK}{tag + '-' if tag else ''}{uuid.uuid4().hex[:12]}"
    return f"{head}/{name}" if head else name


def remove_stale_temps(url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "") -> int:
    """Delete temp files a crashed writer left beside `url` (all of `tag`'s when a tag is given)."""
    head, _, base = url.rpartition("/")
    name = f".*{TEMP_MARK}{tag}-*" if tag else f".{base}{TEMP_MARK}*"
    pattern = urls.join(head, name) if head else name
    fs, path = urls.filesystem(pattern, storage_options)
    stale = fs.glob(path)
    for name in stale:
        fs.rm(name)
    return len(stale)


def _fsync_dir(path: str) -> None:
    """Make a rename in `path` durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicOutput:
    """A binary stream that lands under `url` only on commit(); abort() leaves nothing there."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "",
                 fsync: bool = True) -> None:
        self.url = url
        self._options = storage_options
        self._fsync = fsync  # local files: fsync the data (and the directory entry) on commit
        self._fs, self._path = urls.filesystem(url, storage_options)
        self._temp: str | None = None
        self._state = "open"  # -> "committed" | "aborted"
        if urls.is_local(url):
            self._temp = urls.local_path(temp_name(url, tag))
            os.makedirs(os.path.dirname(os.path.abspath(self._temp)), exist_ok=True)
            self._file: Any = open(self._temp, "wb", buffering=1 << 20)
            return
        if urls.protocol(url) not in STREAMING_UPLOAD_PROTOCOLS:
            self._temp = temp_name(self._path, tag)
        try:
            # from memory, in upload_block_size parts; a finaliser that aborts instead of publishing
            self._file = remote.open_upload(
                self._fs, self._temp or self._path, block_size=urls.upload_block_size(self._fs)
            )
        except (OSError, ValueError) as exc:
            raise ShardIOError(
                f"cannot open for writing: {remote.describe(exc, storage_options)}", url=url
            ) from exc

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    def commit(self) -> None:
        """Make the bytes visible under the final name."""
        if self._state != "open":
            raise ValueError(f"{self.url} is already {self._state}")
        try:
            if urls.is_local(self.url):
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
                self._file.close()
                final = urls.local_path(self.url)
                os.replace(self._temp, final)
                if self._fsync:
                    _fsync_dir(os.path.dirname(os.path.abspath(final)))
            else:
                self._file.close()  # completes the multipart / resumable upload
                if self._temp is not None:
                    self._fs.mv(self._temp, self._path)
            self._state = "committed"
        except Exception as exc:
            self.abort()
            if isinstance(exc, ShardIOError):
                raise
            raise ShardIOError(f"commit failed: {remote.describe(exc, self._options)}", url=self.url) from exc

    def abort(self) -> None:
        """Throw the partial output away; safe to call more than once. Never publishes anything."""
        if self._state != "open":
            return
        self._state = "aborted"
        file = getattr(self, "_file", None)
        try:
            if urls.is_local(self.url):
                if file is not None:
                    file.close()
                if self._temp and os.path.exists(self._temp):
                    os.unlink(self._temp)
                return
            if isinstance(file, AbstractBufferedFile):
                # closed first, then discard(): aborts the S3 multipart / GCS resumable upload, also
                # after a close() that failed half-way; a flush here would publish a partial object
                remote.abort_upload(file, network=not remote._in_event_loop())
            elif file is not None and not getattr(file, "closed", True):
                file.close()
            if self._temp is not None and self._fs.exists(self._temp):
                self._fs.rm(self._temp)
        except Exception:  # noqa: BLE001 - abort is best effort and must not mask the first error
            pass

    def __del__(self) -> None:
        # dropped without commit() (an error unwound past the writer, a killed generator): abort
        if getattr(self, "_state", "aborted") == "open":
            self.abort()


class _HashingSink:
    """Counts and hashes what passes through to the output, so receipts cost no second read.

    With `threaded=True` (what TarWriter uses) the hashing and the writing each happen in a
    background thread, in order, while the caller goes on reading, parsing and encoding: sha256
    and the write system calls release the GIL, so with a spare core they cost little wall time.
    At most `max_inflight` bytes (or one batch, when a batch is larger) wait for those threads, so
    memory stays bounded. An error in the writing thread is raised by the next write() or drain().
    """

    def __init__(self, out: AtomicOutput | BinaryIO, hash_name: str | None, *, threaded: bool = False,
                 max_inflight: int = 8 << 20) -> None:
        self._out = out
        self._hash = hashlib.new(hash_name) if hash_name else None
        self.nbytes = 0
        self._threaded = threaded
        self._threads: list[threading.Thread] = []
        self._max_inflight = max_inflight
        self._inflight = 0
        self._cond = threading.Condition()
        self._queues: list[deque] = []
        self._error: BaseException | None = None
        self._discard = False

    def write(self, data: bytes) -> int:
        self.write_parts([data])
        return len(data)

    def write_parts(self, parts: list[bytes]) -> None:
        """Hash and write `parts` in order (tario.TarStreamWriter hands its batches here)."""
        size = 0
        for part in parts:
            size += len(part)
        self.nbytes += size
        if not self._threaded:
            if self._hash is not None:
                self._digest(parts)
            self._write(parts)
            return
        if not self._threads:
            self._start()
        cond = self._cond
        with cond:
            while self._inflight and self._inflight + size > self._max_inflight and self._error is None:
                cond.wait()
            if self._error is not None:
                raise self._error
            self._inflight += size
            item = [parts, size, len(self._queues)]  # released when every consumer is done with it
            for queue in self._queues:
                queue.append(item)
            cond.notify_all()

    def _digest(self, parts: list[bytes]) -> None:
        update = self._hash.update  # type: ignore[union-attr]
        for part in parts:
            update(part)

    def _write(self, parts: list[bytes]) -> None:
        if self._error is None and not self._discard:
            write = self._out.write
            for part in parts:
                write(part)

    def _start(self) -> None:
        consumers = [self._write] + ([self._digest] if self._hash is not None else [])
        for consume in consumers:
            queue: deque = deque()
            self._queues.append(queue)
            thread = threading.Thread(target=self._run, args=(queue, consume), daemon=True,
                                      name="shardflow-shard-" + consume.__name__.strip("_"))
            self._threads.append(thread)
            thread.start()

    def _run(self, queue: deque, consume: Callable[[list[bytes]], None]) -> None:
        cond = self._cond
        while True:
            with cond:
                while not queue:
                    cond.wait()
                item = queue.popleft()
            if item is None:
                return
            try:
                consume(item[0])
            except BaseException as exc:  # noqa: BLE001 - handed to the writing thread
                if self._error is None:
                    self._error = exc
            finally:
                with cond:
                    item[2] -= 1
                    if item[2] == 0:
                        self._inflight -= item[1]
                        cond.notify_all()

    def drain(self, discard: bool = False) -> None:
        """Wait until every batch was hashed and written (or dropped, with discard=True); raise
        the background threads' error, if any (not when discarding)."""
        threads, self._threads = self._threads, []
        if threads:
            with self._cond:
                self._discard = self._discard or discard
                for queue in self._queues:
                    queue.append(None)
                self._cond.notify_all()
            for thread in threads:
                thread.join()
            self._queues = []
        if self._error is not None and not discard:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        self.drain()
        flush = getattr(self._out, "flush", None)
        if flush is not None:
            flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else ""


Encode = Callable[[Sample], Sample]


class _GzipStage:
    """Gzip between the tar writer and the sink; deterministic (zlib's gzip header has mtime 0)."""

    def __init__(self, sink: "_HashingSink", level: int = 6) -> None:
        self._sink = sink
        self._zip = zlib.compressobj(level, zlib.DEFLATED, 31)

    def write_parts(self, parts: list[bytes]) -> None:
        compressed = [c for c in map(self._zip.compress, parts) if c]
        if compressed:
            self._sink.write_parts(compressed)

    def write(self, data: bytes) -> int:
        self.write_parts([data])
        return len(data)

    def finish(self) -> None:
        self._sink.write_parts([self._zip.flush()])


class TarWriter:
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
        self._atomic: AtomicOutput | None = None
        self._owned: Any = None  # a "-" or pipe: stream opened (and closed) here, not atomic
        if isinstance(target, str) and (target == "-" or target.startswith("pipe:")):
            self._owned = urls.open_write(target, storage_options, allow_pipe=allow_pipe)
            out: Any = self._owned
        elif isinstance(target, str):
            out = self._atomic = AtomicOutput(target, storage_options, tag=temp_tag, fsync=fsync)
        else:
            out = target
        self._sink = _HashingSink(out, checksum, threaded=threaded)
        # a .tar.gz / .tgz name gets what it says: the tar is gzipped on the way to the sink
        self._gzip = _GzipStage(self._sink) if self.url.endswith((".gz", ".tgz")) else None
        self._tar = TarStreamWriter(self._gzip or self._sink, mtime=mtime)  # type: ignore[arg-type]
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
        if self.closed:
            raise ValueError(f"{self.url} is closed")
        before = self._tar.bytes_written
        try:
            for name, data in members:
                self._tar.add(name, data)
        except OSError as exc:
            raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
        self.nsamples += 1
        return self._tar.bytes_written - before

    @property
    def nbytes(self) -> int:
        return self._tar.bytes_written

    def close(self) -> ShardInfo:
        """Finish the archive and commit it; returns its receipt."""
        if self.closed:
            raise ValueError(f"{self.url} is already closed")
        try:
            self._tar.finish()
            if self._gzip is not None:
                self._gzip.finish()
            self._sink.drain()  # every byte hashed and handed to the output
            if self._owned is not None:
                self.closed = True
                self._owned.close()  # a failing pipe: command raises PipeError here
        except BaseException as exc:
            self.closed = False
            self.abort()
            if isinstance(exc, OSError):
                raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
            raise
        self.closed = True
        if self._atomic is not None:
            self._atomic.commit()  # aborts and raises ShardIOError itself when it fails
        return ShardInfo(self.url, self.nsamples, self._sink.nbytes, self._sink.hexdigest())

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

    def __del__(self) -> None:
        # dropped without close() or abort(): stop the writing thread so the output can be aborted
        if not getattr(self, "closed", True):
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - never raise from a finaliser
                pass

    def __enter__(self) -> "TarWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self.closed:
                self.close()
        else:
            self.abort()


def sample_tar_size(members: list[tuple[str, bytes]]) -> int:
    return sum(TarStreamWriter.member_size(name, len(data)) for name, data in members)


def format_shard_name(pattern: str | Callable[[int], str], index: int) -> str:
    """Shard URL for `index`: a callable, a `{shard:06d}`-style format, or a `%06d` pattern."""
    if callable(pattern):
        return pattern(index)
    if "{" in pattern:
        return pattern.format(index, shard=index)
    return pattern % index


class _Committer:
    """Closes finished TarWriters in one background thread, in order, at most one at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._todo: deque[TarWriter | None] = deque()
        self._done: list[ShardInfo] = []
        self._error: BaseException | None = None
        self._busy = 0  # submitted and not finished
        self._thread: threading.Thread | None = None

    def submit(self, writer: TarWriter) -> None:
        cond = self._cond
        with cond:
            while self._busy and self._error is None:  # the previous shard is still committing
                cond.wait()
            if self._error is not None:
                writer.abort()
                self.raise_error()
            self._busy += 1
            self._todo.append(writer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardflow-commit", daemon=True)
                self._thread.start()
            cond.notify_all()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._todo:
                    cond.wait()
                writer = self._todo.popleft()
            if writer is None:
                return
            try:
                info = writer.close()
                with cond:
                    self._done.append(info)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with cond:
                    if self._error is None:
                        self._error = exc
            finally:
                with cond:
                    self._busy -= 1
                    cond.notify_all()

    def take_done(self) -> list[ShardInfo]:
        with self._cond:
            done, self._done = self._done, []
        return done

    def raise_error(self) -> None:
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()

    def stop(self, join: bool = True) -> None:
        thread = self._thread
        if thread is not None:
            self._thread = None
            with self._cond:
                self._todo.append(None)
                self._cond.notify_all()
            if join and thread is not threading.current_thread():
                thread.join()


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
        if maxcount < 1 or maxsize < 3 * BLOCK:
            raise ValueError("maxcount must be >= 1 and maxsize >= 1536 bytes")
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
        self._current: TarWriter | None = None
        # Finished shards are committed by one background thread while the next one is written
        # (hides fsync and the final upload of object stores); receipts and on_commit calls are
        # delivered in order, in the caller's thread, at the next write() or at close().
        self._committer = _Committer() if background_commit else None

    def write(self, sample: Sample) -> None:
        if self._committer is not None and (self._committer._done or self._committer._error):
            self._deliver()
        members = sample_members(self._encoder(sample) if self._encoder else sample)
        size = sample_tar_size(members)
        current = self._current
        if current is not None and (
            current.nsamples >= self.maxcount or current.nbytes + size + 2 * BLOCK > self.maxsize
        ):
            self._finish_current()
            current = None
        if current is None:
            url = format_shard_name(self.pattern, self.index)
            self.index += 1
            current = self._current = TarWriter(
                url, storage_options=self._options, mtime=self._mtime, checksum=self._checksum,
                temp_tag=self._temp_tag, fsync=self._fsync, threaded=self._threaded,
            )
        current.write_members(members)

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
