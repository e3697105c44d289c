"""Atomic publication: a shard appears under its final name only when it is complete.

One small class per kind of storage, named by the record of the URL's protocol (storage.protocols):
- local files are written to a hidden temp name in the same directory, fsynced and renamed;
- object stores (records with streaming_upload: s3, gs, azure, ...) stream to the final key and the
  multipart/resumable upload is completed only by a clean close, and aborted on error;
- other filesystems (memory://, ...) are written to a temp name and moved.
Temp names come from shardflow.storage.atomic, so a rerun finds a killed writer's temps by the same
rule as every other writer of shardflow.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec.spec import AbstractBufferedFile

from shardflow.errors import ShardIOError
from shardflow.storage.atomic import fsync_dir, in_new_folders, temp_name
from shardflow.storage.local_files import named_os_error, open_write_named, start_writeback
from shardflow.storage.paths import filesystem, local_path
from shardflow.storage.protocols import load, protocol_of
from shardflow.storage.retry import describe
from shardflow.storage.upload import abort_upload, in_event_loop, open_upload, upload_block_size


class AtomicOutput:
    """A binary stream that lands under `url` only on commit(); abort() leaves nothing there.

    Subclasses open `_file` and say what publishing (`_publish`) and discarding (`_discard`) mean
    for their storage; the open/committed/aborted states and the error wording are kept here.
    """

    _file: Any

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self._options = storage_options
        self._state = "open"  # -> "committed" | "aborted"

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    def commit(self) -> None:
        """Make the bytes visible under the final name."""
        if self._state != "open":
            raise ValueError(f"{self.url} is already {self._state}")
        try:
            self._publish()
            self._state = "committed"
        except Exception as exc:
            self.abort()
            if isinstance(exc, ShardIOError):
                raise
            raise ShardIOError(f"commit failed: {describe(exc, self._options)}", url=self.url) from exc

    def abort(self) -> None:
        """Throw the partial output away; safe to call more than once. Never publishes anything."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            self._discard()
        except Exception:  # noqa: BLE001 - abort is best effort and must not mask the first error
            pass

    def _publish(self) -> None:
        raise NotImplementedError

    def _discard(self) -> None:
        """Drop what was written; may find `_file` missing when opening it failed."""
        raise NotImplementedError

    def __del__(self) -> None:
        # dropped without commit() (an error unwound past the writer, a killed generator): abort
        if getattr(self, "_state", "aborted") == "open":
            self.abort()


_IOV_MAX = 1024  # POSIX guarantees at least 16; Linux and macOS allow 1024 pieces per writev
_WRITEBACK_STEP = 8 << 20  # a shard that will be fsynced has its writeback started every this many bytes
# The most one write system call is given. Linux (6.x, ext4 and others with large folios) sizes the
# page-cache folios it allocates by the write's length, up to 2 MiB: 10 MB writes took whole 2 MiB
# blocks, whose first touch cost 0.2-2.2 s of system time per GB on the VM measured (0.8 typically),
# against 0.2-0.6 (0.2-0.3 typically) in writes of at most 1 MiB. Larger members go in 1 MiB slices.
# Smaller slices (64-256 KiB) steadied big members no further within the noise, and cost small
# samples: the writing thread takes the GIL back after each write while the main thread runs Python.
_MAX_WRITE = 1 << 20


def _write_groups(parts: list[bytes]) -> list[list[bytes | memoryview]]:
    """`parts` as lists of pieces of at most _MAX_WRITE bytes and _IOV_MAX pieces each (large pieces
    sliced, by reference), in order: one writev() per list."""
    groups: list[list[bytes | memoryview]] = []
    group: list[bytes | memoryview] = []
    room = _MAX_WRITE
    for part in parts:
        size = len(part)
        if size > room:
            view = memoryview(part)
            start = 0
            while size - start > room:
                group.append(view[start : start + room])
                start += room
                groups.append(group)
                group, room = [], _MAX_WRITE
            part = view[start:]
            size -= start
        group.append(part)
        room -= size
        if room == 0 or len(group) == _IOV_MAX:
            groups.append(group)
            group, room = [], _MAX_WRITE
    if group:
        groups.append(group)
    return groups


def _writev_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """writev until every byte of `parts` is written (a regular file rarely writes short)."""
    written = os.writev(fd, parts)
    total = sum(map(len, parts))
    while written < total:  # a short write: finish the rest from where it stopped
        rest: list[bytes | memoryview] = []
        skip = written
        for part in parts:
            if skip >= len(part):
                skip -= len(part)
                continue
            rest.append(memoryview(part)[skip:])
            skip = 0
        parts, total = rest, total - written
        written = os.writev(fd, parts)


class LocalReplace(AtomicOutput):
    """A local file: a hidden temp sibling, fsynced and renamed over the final name on commit.

    `fsync=False` keeps the atomic rename and skips both fsyncs (data and directory entry). With
    fsync, the disk writes are started every few MiB as the shard is written (start_writeback), so the
    fsync on commit waits for the last few MiB only, not for the whole shard.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "",
                 fsync: bool = True) -> None:
        super().__init__(url, storage_options)
        self._fsync = fsync
        self._final = local_path(url)
        self._temp = temp_name(self._final, tag)
        self._derived = bool(tag)  # a name derived from the task: a stale one may be there, or a twin's
        # created afresh when derived (see _open_exclusive); a full disk names the shard either way
        self._file = in_new_folders(_open_exclusive if self._derived else open_write_named, self._temp, self._final)
        self._fd = self._file.fileno()
        self._kicked = 0 if fsync else -1  # bytes whose writeback was started; -1: never start it

    def write_parts(self, parts: list[bytes]) -> None:
        """Write a batch with one writev() per up to 1 MiB (_MAX_WRITE): no copy into a buffer first.

        The tar writer hands ~1 MiB batches of headers and member bytes; a buffered write() would
        copy each piece into Python's buffer and issue a system call per piece or per buffer.
        """
        self._file.flush()  # keep write() and write_parts() in order if both are used
        try:
            for group in _write_groups(parts):
                _writev_all(self._fd, group)
        except OSError as exc:
            raise named_os_error(exc, self._final) from exc
        if self._kicked >= 0:
            end = os.lseek(self._fd, 0, os.SEEK_CUR)
            if end - self._kicked >= _WRITEBACK_STEP:
                # a refusal (no such call here) stops the hints; the fsync on commit does the rest
                self._kicked = end if start_writeback(self._fd, self._kicked, end - self._kicked) else -1

    def _publish(self) -> None:
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        if self._derived:
            _check_still_ours(self._file, self._temp, self.url)
        self._file.close()
        os.replace(self._temp, self._final)
        if self._fsync:
            fsync_dir(os.path.dirname(os.path.abspath(self._final)))

    def _discard(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None and self._derived and not file.closed:
            try:  # leave a twin attempt's file alone: unlink the name only while it is still ours
                _check_still_ours(file, self._temp, self.url)
            except ShardIOError:
                file.close()
                return
        if file is not None:
            file.close()
        if os.path.exists(self._temp):
            os.unlink(self._temp)


def _open_exclusive(path: str, label: str) -> Any:
    """Create `path` afresh: a leftover of a killed attempt (same derived name) is unlinked first, and
    a writer that still holds it open (a duplicate attempt) then fails its commit (_check_still_ours)."""
    try:
        return open_write_named(path, label, exclusive=True)
    except FileExistsError:
        os.unlink(path)
        return open_write_named(path, label, exclusive=True)


def _check_still_ours(file: Any, temp: str, url: str) -> None:
    """Refuse to publish when the temp name now holds another attempt's file (never rename its bytes)."""
    mine = os.fstat(file.fileno())
    try:
        there = os.stat(temp)
    except FileNotFoundError:
        there = None
    if there is None or (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev):
        raise ShardIOError("another attempt of the same task took over its temp file; this one is dropped", url=url)


class StreamingUpload(AtomicOutput):
    """An object store: streamed to the final key from memory; the multipart/resumable upload is
    completed only by a clean close() and aborted otherwise, so the object never exists half-written."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "",
                 fsync: bool = True) -> None:
        super().__init__(url, storage_options)
        self._fs, self._path = filesystem(url, storage_options)
        self._file = _open_upload(self._fs, self._path, url, storage_options)

    def _publish(self) -> None:
        self._file.close()  # completes the multipart / resumable upload

    def _discard(self) -> None:
        _drop_upload(getattr(self, "_file", None))


class TempThenMove(AtomicOutput):
    """Any other fsspec filesystem (memory://, ...): written under a hidden temp name, moved on commit."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "",
                 fsync: bool = True) -> None:
        super().__init__(url, storage_options)
        self._fs, self._path = filesystem(url, storage_options)
        self._temp = temp_name(self._path, tag)
        self._file = _open_upload(self._fs, self._temp, url, storage_options)

    def _publish(self) -> None:
        self._file.close()
        self._fs.mv(self._temp, self._path)

    def _discard(self) -> None:
        _drop_upload(getattr(self, "_file", None))
        if self._fs.exists(self._temp):
            self._fs.rm(self._temp)


def open_atomic(url: str, storage_options: dict[str, Any] | None = None, *, tag: str = "",
                fsync: bool = True) -> AtomicOutput:
    """An AtomicOutput for `url`, of the kind its protocol's record names (`tag`: see
    storage.atomic.temp_name); a protocol without a record gets TempThenMove."""
    publisher: type[AtomicOutput] = load(protocol_of(url).publisher)
    return publisher(url, storage_options, tag=tag, fsync=fsync)  # type: ignore[call-arg]


def _open_upload(fs: Any, path: str, url: str, storage_options: dict[str, Any] | None) -> Any:
    """A write file from memory, in upload_block_size parts, whose finaliser aborts (never publishes)."""
    try:
        return open_upload(fs, path, block_size=upload_block_size(fs))
    except (OSError, ValueError) as exc:
        raise ShardIOError(f"cannot open for writing: {describe(exc, storage_options)}", url=url) from exc


def _drop_upload(file: Any) -> None:
    if isinstance(file, AbstractBufferedFile):
        # closed first, then discard(): aborts the S3 multipart / GCS resumable upload, also after a
        # close() that failed half-way; a flush here would publish a partial object
        abort_upload(file, network=not in_event_loop())
    elif file is not None and not getattr(file, "closed", True):
        file.close()
