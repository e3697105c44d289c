"""Opening a URL: one table says, per scheme, which opener reads it and which writes it.

`open_read` / `open_write` look the URL's scheme up in SCHEMES and hand the request to the opener
named there. Like fsspec's registry, entries name their openers as "module:function" strings imported
on first use, so opening a local file loads neither fsspec nor the object-store machinery.

A protocol not in the table is opened through fsspec the way object stores are: ranged, resumable,
version-pinned reads (a plain stream when the store reports no size) and streamed uploads. Every
remote fsspec filesystem (az://, hf://, sftp://, ...) so gets resume after transient faults; only
in-process filesystems and local wrappers are listed to get fsspec's plain file instead.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Literal

from shardflow.errors import ShardIOError
from shardflow.storage.locate import Locator, resolve
from shardflow.storage.paths import Options, protocol

if TYPE_CHECKING:
    from shardflow.storage.retry import RetryPolicy

STDIO = "-"  # stdin for reading, stdout for writing
CHAINED = "::"  # fsspec's chained URLs (`simplecache::s3://b/k`): the outer filesystem does the work


@dataclass(frozen=True)
class OpenRequest:
    """What open_read / open_write were asked, handed whole to the opener the table picks."""

    url: str
    storage_options: Options = None
    allow_pipe: bool | None = None
    block_size: int | None = None
    readahead: int | None = None
    retry: RetryPolicy | None = None


Opener = Callable[[OpenRequest], BinaryIO]


@dataclass(frozen=True)
class Scheme:
    """How one scheme opens: "module:function" of the opener for reading and for writing."""

    read: str
    write: str


_O = "shardflow.storage.openers"
_P = "shardflow.storage.pipes"
LOCAL = Scheme(f"{_O}:read_local", f"{_O}:write_local")
FSSPEC = Scheme(f"{_O}:read_fsspec", f"{_O}:write_upload")
REMOTE = Scheme(f"{_O}:read_ranged", f"{_O}:write_upload")

SCHEMES: dict[str, Scheme] = {
    STDIO: Scheme(f"{_P}:open_stdin", f"{_P}:open_stdout"),
    CHAINED: FSSPEC,
    "blockcache": FSSPEC,
    "cached": FSSPEC,
    "dir": FSSPEC,
    "file": LOCAL,
    "filecache": FSSPEC,
    "gcs": REMOTE,
    "gs": REMOTE,
    "http": REMOTE,
    "https": REMOTE,
    "libarchive": FSSPEC,
    "local": LOCAL,
    "memory": FSSPEC,
    "pipe": Scheme(f"{_P}:read_pipe", f"{_P}:write_pipe"),
    "reference": FSSPEC,
    "s3": REMOTE,
    "s3a": REMOTE,
    "simplecache": FSSPEC,
    "tar": FSSPEC,
    "zip": FSSPEC,
}
DEFAULT = REMOTE  # any other fsspec protocol

# '::' inside these is part of a command or a file name, not an fsspec chain
_NEVER_CHAINED = frozenset({"file", "local", "pipe"})


def scheme_of(url: str) -> str:
    """The SCHEMES key of `url`: '-', '::' for a chained fsspec URL, else its protocol."""
    if url == STDIO:
        return STDIO
    name = protocol(url)
    if CHAINED in url and name not in _NEVER_CHAINED:
        return CHAINED
    return name


@functools.cache
def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def opener(url: str, mode: Literal["read", "write"]) -> Opener:
    """The opener SCHEMES names for `url` and `mode`."""
    if "://***@" in url or ":***@" in url:
        raise ShardIOError(
            "the password of this URL was left out when the run directory was written (it is never written "
            "down): give the credential through storage options (e.g. headers with a ${VAR} reference) or "
            "run from the process that planned the job", url=url)
    scheme = SCHEMES.get(scheme_of(url), DEFAULT)
    return _load(getattr(scheme, mode))


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
