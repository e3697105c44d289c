"""Everything shardflow knows about a storage protocol, in ONE record per protocol.

How a URL is opened for reading and writing, how a shard is published atomically there, which
version-pinned source serves its ranged reads, whether it lists by key prefix, uploads in parts or
reads small files in one request: each protocol answers all of these in one `Protocol` row of
PROTOCOLS, as fsspec's `registry.py` keeps one row per filesystem. Adding a store (a plugin, a test)
is one `register_protocol(Protocol(...))`; no other table needs to learn its name.

Like fsspec's registry, records name code as "module:attr" strings imported on first use (`load`),
so looking a protocol up loads neither fsspec nor the object-store machinery. A protocol without a
record gets DEFAULT: any remote fsspec filesystem (az://, hf://, sftp://, ...) is read ranged,
resumable and version-pinned, uploaded by a stream, and published under a temp name then moved.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, replace
from typing import Any

from shardflow.storage.paths import fs_protocols, protocol

STDIO = "-"  # the record open_read / open_write use for stdin / stdout
CHAINED = "::"  # the record for fsspec's chained URLs (`simplecache::s3://b/k`): the outer filesystem works

_O = "shardflow.storage.openers"
_P = "shardflow.storage.pipes"
_PUB = "shardflow.storage.publish"
_SRC = "shardflow.storage.sources"
_CW = "shardflow.storage.conditional"
_UP = "shardflow.storage.upload"


@dataclass(frozen=True)
class Protocol:
    """One storage protocol: every per-protocol decision of the storage layer, read from here only.

    Code is named as "module:attr" (see `load`), so a record costs no import until it is used.
    """

    name: str
    # openers (storage.schemes: open_read / open_write) taking an OpenRequest
    read: str = f"{_O}:read_ranged"
    write: str = f"{_O}:write_upload"
    # the AtomicOutput class that publishes a shard there (storage.publish.open_atomic)
    publisher: str = f"{_PUB}:TempThenMove"
    # the publisher streams to the final key: no temp is ever written, so none is looked for on rerun
    streaming_upload: bool = False
    # uploads go up in DEFAULT_UPLOAD_BLOCK_SIZE parts (S3 multipart, GCS resumable); else fsspec's size
    part_upload: bool = False
    # globs list only the keys starting with their literal part, server-side (s3fs/gcsfs find(prefix=))
    listing_by_prefix: bool = False
    # the ObjectSource class pinning one version of an object for ranged reads (None: the generic one),
    # used only when the filesystem has `source_needs` (else another library owns the protocol name)
    source: str | None = None
    source_needs: str = ""
    # (async (fs, folder, prefix) -> base names, the filesystem attribute it needs): a folder's names
    # listed without the client building a dict per key (storage.s3_listing); None: fsspec's listing
    lean_listing: tuple[str, str] | None = None
    # small files are fetched with cat(max_concurrency=1): s3fs would HEAD each one first otherwise
    cat_in_one_request: bool = False
    # '::' in its URLs is an fsspec chain; False where it belongs to a file name or a command
    chained: bool = True
    # conditional writes (storage.conditional): (put_if, version_of) as "module:attr" strings, put_if
    # creating a small object only if absent or only if still at the version read; None: the store has
    # none shardflow uses (a run directory's lease there is best effort, rundir.lease)
    conditional_put: tuple[str, str] | None = None
    # unfinished uploads a killed writer leaves open (billed, unlisted): (list_open, abort) as "module:attr"
    # (storage.upload), so a task's restart aborts its own (storage.stale_uploads); None: the store keeps
    # none (gcsfs's resumable sessions are no objects and expire in a week) or shardflow cannot list them
    open_uploads: tuple[str, str] | None = None


DEFAULT = Protocol("*")  # any fsspec protocol without a record
_FSSPEC = Protocol("*", read=f"{_O}:read_fsspec")  # in-process filesystems and local wrappers: fsspec's own file
_LOCAL = Protocol("*", read=f"{_O}:read_local", write=f"{_O}:write_local", publisher=f"{_PUB}:LocalReplace",
                  chained=False)
# object stores whose uploads complete on close() and can be aborted instead
_STREAMING = Protocol("*", publisher=f"{_PUB}:StreamingUpload", streaming_upload=True)
_BIG_STORE = replace(_STREAMING, part_upload=True, listing_by_prefix=True)


def _rows(template: Protocol, *names: str, **fields: Any) -> list[Protocol]:
    """One record per name, all alike (a store reached by several protocol names: s3 and s3a)."""
    return [replace(template, name=name, **fields) for name in names]


PROTOCOLS: dict[str, Protocol] = {record.name: record for record in [
    Protocol(STDIO, read=f"{_P}:open_stdin", write=f"{_P}:open_stdout"),
    Protocol("pipe", read=f"{_P}:read_pipe", write=f"{_P}:write_pipe", chained=False),
    *_rows(_LOCAL, "file", "local"),
    *_rows(_FSSPEC, CHAINED, "blockcache", "cached", "dir", "filecache", "libarchive", "memory", "reference",
           "simplecache", "tar", "zip"),
    *_rows(DEFAULT, "http", "https", source=f"{_SRC}:HTTPSource", source_needs="encode_url"),
    *_rows(_BIG_STORE, "s3", "s3a", source=f"{_SRC}:S3Source", source_needs="_call_s3", cat_in_one_request=True,
           conditional_put=(f"{_CW}:s3_put_if", f"{_CW}:s3_version"),
           lean_listing=("shardflow.storage.s3_listing:names_in", "_call_s3"),
           open_uploads=(f"{_UP}:s3_open_uploads", f"{_UP}:s3_abort_upload")),
    *_rows(_BIG_STORE, "gs", "gcs", source=f"{_SRC}:GCSSource", source_needs="call",
           conditional_put=(f"{_CW}:gcs_put_if", f"{_CW}:gcs_version")),
    *_rows(_STREAMING, "az", "abfs", "abfss", "adl", "oci", "oss"),
]}


def register_protocol(record: Protocol, *, clobber: bool = False) -> None:
    """Teach shardflow a protocol (a plugin's filesystem, a test's) with its one record.

    The fsspec filesystem itself is registered with fsspec (`fsspec.register_implementation`); this
    says how shardflow opens, publishes, lists and reads it. An existing record is replaced only
    with `clobber`, so two plugins claiming one name fail loudly instead of silently.
    """
    if record.name in PROTOCOLS and PROTOCOLS[record.name] != record and not clobber:
        raise ValueError(f"protocol {record.name!r} already has a record; pass clobber=True to replace it")
    PROTOCOLS[record.name] = record


def protocol_named(name: str) -> Protocol:
    """The record of the protocol `name` (DEFAULT when it has none)."""
    return PROTOCOLS.get(name, DEFAULT)


def protocol_of(url: str) -> Protocol:
    """The record of a URL's protocol ('file' for plain paths, 'pipe' for `pipe:` commands)."""
    return PROTOCOLS.get(protocol(url), DEFAULT)


def protocol_of_fs(fs: Any) -> Protocol:
    """The record of an fsspec filesystem: its first protocol name with a record (s3fs: 's3'), else
    DEFAULT. A filesystem is asked rather than a URL where only the filesystem is at hand."""
    for name in fs_protocols(fs):
        record = PROTOCOLS.get(name)
        if record is not None:
            return record
    return DEFAULT


@functools.cache
def load(target: str) -> Any:
    """The object a record names as "module:attr", imported on first use and kept."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def lean_lister(fs: Any) -> Any:
    """The async (fs, folder, prefix) -> base names of `fs`'s protocol (Protocol.lean_listing), or None."""
    lean = protocol_of_fs(fs).lean_listing
    return load(lean[0]) if lean is not None and hasattr(fs, lean[1]) else None
