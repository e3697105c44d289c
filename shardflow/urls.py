"""Shard specs and opening URLs through fsspec.

A *spec* names a list of shards: a brace pattern (`x-{000000..000554}.tar`, several groups allowed),
a glob on any fsspec filesystem (`s3://b/train-*.tar`, one listing per pattern), a list of either, or
`-` for stdin/stdout. Opening goes through fsspec so every scheme it knows works the same way.
`pipe:CMD` URLs run a shell command and are refused unless the caller allows them, because a spec
often comes from a config file and should not be able to run programs.

`storage_options` everywhere may be a flat dict or a per-URL-prefix dict (see
`storage_options.options_for`). Remote reads return a `remote.RemoteReader` (bounded read-ahead,
resume after transient faults, version-pinned); remote writes stream from memory
(multipart/resumable upload) and never commit on garbage collection. Error messages name the URL
and never contain credentials.
"""

from __future__ import annotations

import os
import signal
import re
import subprocess
import sys
from typing import IO, Any, BinaryIO, Mapping, Sequence

import braceexpand
import fsspec

from . import remote
from .errors import PipeError, ShardIOError
from .storage_options import options_for, scrub

_GLOB_CHARS = set("*?[")
PIPE_ENV = "SHARDFLOW_ALLOW_PIPE"
# Filesystems read with plain fs.open: in-process or wrappers whose own reads are local.
_DIRECT_READ_PROTOCOLS = frozenset({"memory", "file", "local", "zip", "tar", "reference", "cached",
                                    "simplecache", "filecache", "blockcache", "dir", "libarchive"})

Spec = str | Sequence[str]
Options = Mapping[str, Any] | None


def expand(spec: Spec, storage_options: Options = None) -> list[str]:
    """Turn a spec into the ordered list of shard URLs it names.

    Brace groups expand in order; patterns with glob characters are listed once each and sorted.
    A spec with no shards is an error: an empty run is almost always a typo.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    for part in parts:
        if part == "-" or part.startswith("pipe:"):
            urls.append(part)
            continue
        for url in braceexpand.braceexpand(part):
            if _GLOB_CHARS & set(_path_part(url)):
                urls.extend(_glob(url, storage_options))
            else:
                urls.append(url)
    if not urls:
        raise ShardIOError(f"spec {spec!r} names no shards")
    return urls


def _path_part(url: str) -> str:
    """The part of a URL that can hold glob characters (not the scheme or query)."""
    return url.split("://", 1)[-1]


def _glob(pattern: str, storage_options: Options) -> list[str]:
    """Shards matching one glob pattern, with one listing (paged) of the store.

    On object stores a single-level pattern (`s3://b/dir/train-*.tar`) lists only the keys that
    start with its literal part (`dir/train-`), server-side, instead of the whole bucket.
    """
    options = options_for(pattern, storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(pattern, **options)
        matches = sorted(_list_matches(fs, path))
    except FileNotFoundError:
        matches = []
    except (OSError, ValueError) as exc:
        raise ShardIOError(f"cannot list: {remote.describe(exc, options)}", url=pattern) from exc
    if not _basename(pattern).startswith("."):
        # like a shell: `*` does not match hidden names (writer temps `.x.tar.tmp-...`, markers)
        matches = [m for m in matches if not _basename(m).startswith(".")]
    if not matches:
        raise ShardIOError(f"glob {pattern!r} matched no shards")
    if "://" not in pattern:
        return matches
    return [fs.unstrip_protocol(m) for m in matches]


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _list_matches(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    first = min(path.index(c) for c in _GLOB_CHARS if c in path)
    literal, tail = path[:first], path[first:]
    classes = {c.__name__ for c in type(fs).__mro__}
    prefix_listing = bool(classes & {"S3FileSystem", "GCSFileSystem"})
    if not prefix_listing or "/" in tail or "**" in tail or "/" not in literal:
        try:
            fs.invalidate_cache()
        except Exception:  # noqa: BLE001
            pass
        return [m for m in fs.glob(path) if not _is_dir_marker(fs, m)]
    root, _, base = literal.rpartition("/")
    try:
        fs.invalidate_cache(root)
    except Exception:  # noqa: BLE001
        pass
    names = fs.find(root, maxdepth=1, withdirs=False, prefix=base)
    regex = re.compile(fsspec.utils.glob_translate(path))
    return [n for n in names if regex.match(n)]


def _is_dir_marker(fs: fsspec.AbstractFileSystem, name: str) -> bool:
    return name.endswith("/")


def protocol(url: str) -> str:
    """The fsspec protocol of a URL ('file' for plain paths)."""
    if url.startswith("pipe:"):
        return "pipe"
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0]


def is_local(url: str) -> bool:
    return protocol(url) in ("file", "local")


def local_path(url: str) -> str:
    """The filesystem path of a local URL."""
    return url[len("file://"):] if url.startswith("file://") else url


def filesystem(url: str, storage_options: Options = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and path within it for `url` (options resolved for that URL)."""
    options = options_for(url, storage_options)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError, TypeError) as exc:
        raise ShardIOError(f"cannot use this URL: {remote.describe(exc, options)}", url=url) from exc


def join(base: str, *names: str) -> str:
    """Join path parts onto a URL or path with '/' (object stores have no other separator)."""
    out = base.rstrip("/")
    for name in names:
        out = f"{out}/{name.strip('/')}"
    return out


def pipe_allowed(allow_pipe: bool | None) -> bool:
    if allow_pipe is not None:
        return allow_pipe
    return os.environ.get(PIPE_ENV, "") not in ("", "0", "false", "no")


def _streams_remotely(url: str, fs: fsspec.AbstractFileSystem) -> bool:
    if "::" in url:
        return False
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return not (set(protocols) & _DIRECT_READ_PROTOCOLS)


def open_read(
    url: str,
    storage_options: Options = None,
    *,
    allow_pipe: bool | None = None,
    block_size: int | None = None,
    readahead: int | None = None,
    retry: remote.RetryPolicy | None = None,
) -> BinaryIO:
    """Open a shard for streaming reads. Raises ShardIOError naming the URL when it cannot.

    Remote objects come back as a `remote.RemoteReader`: ranged reads of `block_size` bytes (8 MiB)
    with `readahead` blocks (1) in flight, transient faults retried per `retry` from the offset
    reached, and an object that changes or shrinks during the read reported as an error.
    """
    if url == "-":
        return _Unclosable(sys.stdin.buffer)  # type: ignore[return-value]
    if url.startswith("pipe:"):
        return PipeStream(url, "rb", allow_pipe=allow_pipe)  # type: ignore[return-value]
    options = options_for(url, storage_options)
    try:
        if is_local(url):
            return open(local_path(url), "rb", buffering=1 << 20)
        fs, path = fsspec.core.url_to_fs(url, **options)
        if _streams_remotely(url, fs):
            try:
                return remote.RemoteReader(  # type: ignore[return-value]
                    url, fs, path,
                    block_size=block_size or remote.DEFAULT_BLOCK_SIZE,
                    readahead=remote.DEFAULT_READAHEAD if readahead is None else readahead,
                    retry=retry or remote.DEFAULT_RETRY,
                    storage_options=options,
                )
            except ShardIOError as exc:
                if "reports no size" not in exc.reason:
                    raise
                # a server without sizes or ranges: one plain stream, no resume
        return fs.open(path, "rb", block_size=block_size or remote.DEFAULT_BLOCK_SIZE)
    except ShardIOError:
        raise
    except FileNotFoundError as exc:
        raise ShardIOError("no such file or object", url=url) from exc
    except IsADirectoryError as exc:
        raise ShardIOError("is a directory, not a shard", url=url) from exc
    except (OSError, ValueError, ImportError, TypeError) as exc:
        raise ShardIOError(f"cannot open for reading: {remote.describe(exc, options)}", url=url) from exc


def open_write(
    url: str,
    storage_options: Options = None,
    *,
    allow_pipe: bool | None = None,
    block_size: int | None = None,
) -> BinaryIO:
    """Open a URL for a streaming write (no atomicity here: see writer.py).

    Remote files upload from memory in `block_size` parts (16 MiB; S3 multipart, GCS resumable)
    and are created by close(); a file dropped without close() is aborted, not published.
    """
    if url == "-":
        return _Unclosable(sys.stdout.buffer)  # type: ignore[return-value]
    if url.startswith("pipe:"):
        return PipeStream(url, "wb", allow_pipe=allow_pipe)  # type: ignore[return-value]
    options = options_for(url, storage_options)
    try:
        if is_local(url):
            path = local_path(url)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            return open(path, "wb", buffering=1 << 20)
        fs, path = fsspec.core.url_to_fs(url, **options)
        return remote.open_upload(fs, path, block_size=block_size or upload_block_size(fs))
    except (OSError, ValueError, ImportError, TypeError) as exc:
        raise ShardIOError(f"cannot open for writing: {remote.describe(exc, options)}", url=url) from exc


def upload_block_size(fs: fsspec.AbstractFileSystem) -> int | None:
    """Part size for streaming uploads to `fs` (None: the filesystem's own default)."""
    classes = {c.__name__ for c in type(fs).__mro__}
    if classes & {"S3FileSystem", "GCSFileSystem"}:
        return remote.DEFAULT_UPLOAD_BLOCK_SIZE
    return None


def error_text(exc: BaseException, storage_options: Options = None) -> str:
    """An exception as text fit for logs and run directories: credentials scrubbed."""
    return scrub(str(exc), storage_options)


class _Unclosable:
    """stdin/stdout wrapper whose close() flushes but leaves the process's stream open."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(n)

    def write(self, data: bytes) -> int:
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if hasattr(self._stream, "flush") and self._stream.writable():
            self._stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PipeStream:
    """A `pipe:CMD` stream: the command's stdout (read) or stdin (write).

    The subprocess never outlives the stream: close() closes the pipe, reaps the process and raises
    PipeError if it exited non-zero, so a failing `curl` is an error rather than a short shard. A
    reader closed before the end kills the command instead of waiting for it.
    """

    def __init__(self, url: str, mode: str, *, allow_pipe: bool | None = None) -> None:
        if not pipe_allowed(allow_pipe):
            raise PipeError(
                f"pipe: URLs run shell commands and are off by default; pass allow_pipe=True "
                f"or set {PIPE_ENV}=1 to allow them",
                url=url,
            )
        self.url = url
        self.mode = mode
        command = url[len("pipe:"):]
        # its own process group, so that stopping it stops every command of a pipeline, not only `sh`
        if mode == "rb":
            self._proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, bufsize=1 << 20,
                                          start_new_session=True)
            self._pipe = self._proc.stdout
        else:
            self._proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, bufsize=1 << 20,
                                          start_new_session=True)
            self._pipe = self._proc.stdin
        self._eof = False
        self._killed = False
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        # read1: hand over what the command has written so far, so a slow command's first sample is
        # not held back until a whole buffer fills
        data = self._pipe.read() if n < 0 else self._pipe.read1(n)
        if n < 0 or not data:
            self._eof = True
        return data

    def write(self, data: bytes) -> int:
        return self._pipe.write(data)

    def flush(self) -> None:
        if self.mode == "wb":
            self._pipe.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.mode == "rb" and not self._eof:
            rest = self._pipe.read(1)
            if rest:  # the reader stopped early: do not wait for a command that may never end
                self._kill()
        try:
            self._pipe.close()
        except BrokenPipeError:
            pass
        status = self._proc.wait()
        if status != 0 and not self._killed:
            raise PipeError(f"command exited with status {status}", url=self.url)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._killed = True

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self._kill()
            self._proc.wait()

