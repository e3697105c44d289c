"""Local files whose failures say which file, and local inputs pinned to the version opened.

- `open_write_named(path, label)`: a full disk (ENOSPC), a quota or an I/O error while writing raises
  an OSError naming `label` (the final name of what was being written), not a bare
  `[Errno 28] No space left on device` that leaves the user guessing which of a thousand files.
- `open_read_pinned(path, url)`: a local input is pinned by (size, mtime_ns, inode, device) when it is
  opened, like S3 reads are pinned by ETag; a file overwritten in place while it is read fails the
  read with ObjectChangedError instead of yielding a shard that mixes old and new samples. A file
  renamed over (how shardflow and most tools publish) is read to its end in the version opened.
- `start_writeback(fd, offset, length)`: start writing a range of a file to disk now, without waiting
  (Linux sync_file_range), so a later fsync finds little left to do.
"""

from __future__ import annotations

import functools
import io
import os
import sys
from typing import Any, Callable

from shardflow.errors import ShardIOError

_BUFFER = 1 << 20


class ObjectChangedError(ShardIOError):
    """The object was replaced, deleted or truncated while it was being read."""


def named_os_error(exc: OSError, label: str) -> OSError:
    """`exc` again, naming `label` when it named no file (same errno, so the same OSError subclass)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), label)


class _NamedWriteFile(io.FileIO):
    """A raw local file for writing whose write errors name the file they were writing."""

    def __init__(self, path: str, label: str, mode: str = "wb") -> None:
        super().__init__(path, mode)
        self.label = label

    def write(self, data: Any) -> int | None:  # type: ignore[override]
        try:
            return super().write(data)
        except OSError as exc:
            raise named_os_error(exc, self.label) from exc


def open_write_named(path: str, label: str | None = None, buffering: int = _BUFFER, *,
                     exclusive: bool = False) -> io.BufferedWriter:
    """`open(path, "wb")` whose write errors (also those of flush and close) name `label` (default: path);
    `exclusive`: "xb", a new file or FileExistsError."""
    raw = _NamedWriteFile(path, label or path, "xb" if exclusive else "wb")
    return io.BufferedWriter(raw, buffer_size=buffering)


_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the dirty pages in the range; wait for nothing


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing bytes [offset, offset + length) of `fd` to disk, without waiting for them.

    Why: a shard is fsynced on commit; left alone, the kernel starts writeback only when dirty pages
    pile up (10 % of memory), so the fsync of a 1 GB shard waited ~0.25 s for the disk after the last
    write. Started as the shard is written, that disk time overlaps the work. A hint only: durability
    still comes from the fsync (this flag neither waits nor consumes the file's writeback errors).
    False when the system has no such call or refused it (then the fsync does it all, as before)."""
    call = _writeback_call()
    if call is None or length <= 0:
        return False
    return call(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0


@functools.lru_cache(maxsize=None)
def _writeback_call() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux only), looked up once per process."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def _pin(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


class _PinnedReadFile(io.FileIO):
    """A raw local file for reading that checks, after every read, that the file is still the one opened."""

    def __init__(self, path: str, url: str) -> None:
        super().__init__(path, "rb")
        self.url = url
        self.pin = _pin(os.fstat(self.fileno()))

    def _check(self) -> None:
        # fstat: the inode this file descriptor reads. A file renamed over or deleted meanwhile is
        # still read whole in the version opened (consistent); one rewritten in place is not.
        now = _pin(os.fstat(self.fileno()))
        if now != self.pin:
            size, mtime, _, _ = self.pin
            raise ObjectChangedError(
                f"local file overwritten while it was being read (size {size}, mtime_ns {mtime} at open; size "
                f"{now[0]}, mtime_ns {now[1]} now): its samples would mix two versions", url=self.url)

    def readinto(self, buffer: Any) -> int | None:  # type: ignore[override]
        n = super().readinto(buffer)
        self._check()
        return n

    def read(self, size: int = -1) -> bytes | None:  # type: ignore[override]
        data = super().read(size)
        self._check()
        return data

    def readall(self) -> bytes:
        data = super().readall()
        self._check()
        return data


class _PinnedReader(io.BufferedReader):
    """The buffered side of a pinned file: a read(n) asks for no more than the pinned size has left.

    Why: io.BufferedReader allocates the n bytes asked for before it reads, so the 1 MiB reads of the
    tar reader cost a 1 MiB allocation each, even for a 2 KB shard and at its end (three a shard:
    ~22 us of every tiny task). At the pinned end it returns b"" after the same check a read makes."""

    def read(self, size: int | None = -1) -> bytes:
        raw: _PinnedReadFile = self.raw  # type: ignore[assignment]
        if size is None or size <= 0:
            return super().read(size)
        left = raw.pin[0] - self.tell()
        if left <= 0:
            raw._check()  # grown or rewritten since it was opened: said, as a read would
            return super().read(size) if left < 0 else b""
        return super().read(min(size, left))


def open_read_pinned(path: str, url: str, buffering: int = _BUFFER) -> io.BufferedReader:
    """`open(path, "rb")` that raises ObjectChangedError when the file changes while it is read."""
    return _PinnedReader(_PinnedReadFile(path, url), buffer_size=buffering)
