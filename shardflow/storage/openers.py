"""How a storage URL is opened, one function per way: local file, plain fsspec stream, ranged remote
read, streamed upload. The record of the URL's protocol (protocols.py) says which one it gets.

Every opener here resolves the storage options that apply to its URL, and turns a failure into a
ShardIOError that names the URL and never contains a credential. fsspec is imported only by the
openers that use it, so opening a local file does not load it.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

from shardflow.errors import ShardIOError
from shardflow.storage.local_files import open_read_pinned, open_write_named
from shardflow.storage.options import options_for
from shardflow.storage.paths import local_path
from shardflow.storage.remote_read import DEFAULT_BLOCK_SIZE, DEFAULT_READAHEAD, RemoteReader, UnsizedObjectError
from shardflow.storage.retry import DEFAULT_RETRY, describe
from shardflow.storage.upload import open_upload, upload_block_size

if TYPE_CHECKING:
    from shardflow.storage.schemes import OpenRequest

_BUFFER = 1 << 20  # local files: 1 MiB buffers, tar members are read and written in big pieces
_StorageOpener = Callable[["OpenRequest", dict[str, Any]], Any]


def reading(opener: _StorageOpener) -> Callable[[OpenRequest], BinaryIO]:
    """An opener for reading: options resolved for the URL, failures as ShardIOError naming it."""

    @functools.wraps(opener)
    def open_for_reading(request: OpenRequest) -> BinaryIO:
        url = request.url
        options = options_for(url, request.storage_options)
        if names_a_folder(url):  # a store client would fail on the empty key with its own multi-line error
            raise ShardIOError("names a folder, not a shard (a glob lists its shards: "
                               f"{url.rstrip('/')}/*.tar)", url=url)
        try:
            return opener(request, options)
        except ShardIOError:
            raise
        except FileNotFoundError as exc:
            raise ShardIOError("no such file or object", url=url) from exc
        except IsADirectoryError as exc:
            raise ShardIOError("is a directory, not a shard", url=url) from exc
        except (OSError, ValueError, ImportError, TypeError) as exc:
            raise ShardIOError(f"cannot open for reading: {describe(exc, options)}", url=url) from exc

    return open_for_reading


def names_a_folder(url: str) -> bool:
    """Whether a remote URL names a bucket or a folder (`s3://b`, `s3://b/`, `gs://b/dir/`) rather than an
    object. Local paths are left to the operating system, which says "is a directory" itself, and web
    URLs to their server (`https://host/get/` may well answer with a shard)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme in ("file", "local", "http", "https") or "::" in url or "?" in rest:
        return False
    return "/" not in rest.strip("/") if not rest.endswith("/") else True


def writing(opener: _StorageOpener) -> Callable[[OpenRequest], BinaryIO]:
    """An opener for writing: options resolved for the URL, failures as ShardIOError naming it."""

    @functools.wraps(opener)
    def open_for_writing(request: OpenRequest) -> BinaryIO:
        options = options_for(request.url, request.storage_options)
        try:
            return opener(request, options)
        except (OSError, ValueError, ImportError, TypeError) as exc:
            raise ShardIOError(f"cannot open for writing: {describe(exc, options)}", url=request.url) from exc

    return open_for_writing


def _url_to_fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    import fsspec.core

    return fsspec.core.url_to_fs(url, **options)


@reading
def read_local(request: OpenRequest, options: dict[str, Any]) -> Any:
    """A local file, through the operating system (no fsspec layer in the way)."""
    return open_read_pinned(local_path(request.url), request.url, _BUFFER)  # fails if it changes meanwhile


@writing
def write_local(request: OpenRequest, options: dict[str, Any]) -> Any:
    """A local file, its folder created when missing (no atomicity here: see atomic.py)."""
    path = local_path(request.url)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open_write_named(path, path, _BUFFER)  # a full disk names the file


@reading
def read_fsspec(request: OpenRequest, options: dict[str, Any]) -> Any:
    """fsspec's own file: for in-process filesystems and wrappers whose reads are local."""
    fs, path = _url_to_fs(request.url, options)
    return fs.open(path, "rb", block_size=request.block_size or DEFAULT_BLOCK_SIZE)


@reading
def read_ranged(request: OpenRequest, options: dict[str, Any]) -> Any:
    """A RemoteReader (ranged, resumable, version-pinned); one plain stream if the store gives no size."""
    fs, path = _url_to_fs(request.url, options)
    try:
        return RemoteReader(
            request.url, fs, path,
            block_size=request.block_size or DEFAULT_BLOCK_SIZE,
            readahead=DEFAULT_READAHEAD if request.readahead is None else request.readahead,
            retry=request.retry or DEFAULT_RETRY,
            storage_options=options,
        )
    except UnsizedObjectError:
        return fs.open(path, "rb", block_size=request.block_size or DEFAULT_BLOCK_SIZE)  # no resume


@writing
def write_upload(request: OpenRequest, options: dict[str, Any]) -> Any:
    """A streamed upload from memory, created by close() and aborted when dropped (see upload.py)."""
    fs, path = _url_to_fs(request.url, options)
    return open_upload(fs, path, block_size=request.block_size or upload_block_size(fs))
