"""Opening a URL: `open_read` / `open_write` hand the request to the opener its protocol's record names.

The record (storage.protocols) names its openers as "module:function" strings imported on first use,
so opening a local file loads neither fsspec nor the object-store machinery. A protocol without a
record is opened the way object stores are: ranged, resumable, version-pinned reads (a plain stream
when the store reports no size) and streamed uploads, so every remote fsspec filesystem (az://,
hf://, sftp://, ...) gets resume after transient faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Callable, Literal

from shardflow.errors import ShardIOError
from shardflow.storage.locate import Locator, resolve
from shardflow.storage.paths import Options, protocol
from shardflow.storage.protocols import CHAINED, STDIO, load, protocol_named

if TYPE_CHECKING:
    from shardflow.storage.retry import RetryPolicy


@dataclass(frozen=True)
class OpenRequest:
    """What open_read / open_write were asked, handed whole to the opener the record names."""

    url: str
    storage_options: Options = None
    allow_pipe: bool | None = None
    block_size: int | None = None
    readahead: int | None = None
    retry: RetryPolicy | None = None


Opener = Callable[[OpenRequest], BinaryIO]


def scheme_of(url: str) -> str:
    """The record name `url` opens with: '-', '::' for a chained fsspec URL, else its protocol."""
    if url == STDIO:
        return STDIO
    name = protocol(url)
    if CHAINED in url and protocol_named(name).chained:
        return CHAINED
    return name


def opener(url: str, mode: Literal["read", "write"]) -> Opener:
    """The opener the record of `url`'s protocol names for `mode`."""
    if "://***@" in url or ":***@" in url:
        raise ShardIOError(
            "the password of this URL was left out when the run directory was written (it is never written "
            "down): give the credential through storage options (e.g. headers with a ${VAR} reference) or "
            "run from the process that planned the job", url=url)
    return load(getattr(protocol_named(scheme_of(url)), mode))


def open_read(
    url: str,
    storage_options: Options = None,
    *,
    allow_pipe: bool | None = None,
    block_size: int | None = None,
    readahead: int | None = None,
    retry: RetryPolicy | None = None,
    locator: Locator | None = None,
) -> BinaryIO:
    """Open a shard for streaming reads. Raises ShardIOError naming the URL when it cannot.

    Remote objects come back as a `remote_read.RemoteReader`: ranged reads of `block_size` bytes
    (8 MiB) with `readahead` blocks (1) in flight, transient faults retried per `retry` from the
    offset reached, and an object that changes or shrinks during the read reported as an error.
    `pipe:` URLs run only when `allow_pipe` (or SHARDFLOW_ALLOW_PIPE) says so. Rewrite rules and a
    mirror directory (storage.locate: `locator`, else the process's) decide the URL really read;
    only reads are rewritten.
    """
    url = locator.resolve(url) if locator is not None else resolve(url)
    request = OpenRequest(url, storage_options, allow_pipe=allow_pipe, block_size=block_size, readahead=readahead,
                          retry=retry)
    return opener(url, "read")(request)


def open_write(
    url: str,
    storage_options: Options = None,
    *,
    allow_pipe: bool | None = None,
    block_size: int | None = None,
) -> BinaryIO:
    """Open a URL for a streaming write (no atomicity here: see atomic.py and the shard writer).

    Remote files upload from memory in `block_size` parts (16 MiB; S3 multipart, GCS resumable)
    and are created by close(); a file dropped without close() is aborted, not published.
    """
    request = OpenRequest(url, storage_options, allow_pipe=allow_pipe, block_size=block_size)
    return opener(url, "write")(request)
