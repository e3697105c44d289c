"""Streaming uploads that never publish by accident.

S3 multipart and GCS resumable uploads stream from memory (no temp file) and become visible only on
a clean `close()`. fsspec's files *commit on garbage collection* (`AbstractBufferedFile.__del__`
calls `close()`; gcsfs defers the same close to a thread), which would publish a partial object when
a writer is dropped after an error. Files from `open_upload` are switched to a subclass whose
finaliser aborts the upload instead.

A writer killed outright aborts nothing: on S3 its multipart upload stays open. The primitives to
list and abort such leftovers (named by the protocol record's `open_uploads`) are at the end of this
module; storage.stale_uploads decides which of them are dead when a task starts again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from shardflow.storage.protocols import protocol_of_fs
from shardflow.storage.retry import describe

log = logging.getLogger("shardflow.storage.upload")

# S3 multipart parts / GCS resumable chunks: >= 5 MiB (S3 minimum), multiple of 256 KiB (GCS).
DEFAULT_UPLOAD_BLOCK_SIZE = 16 * 2**20

_SAFE_CLASSES: dict[type, type] = {}


def upload_block_size(fs: Any) -> int | None:
    """Part size for streaming uploads to `fs`: DEFAULT_UPLOAD_BLOCK_SIZE where its protocol's record
    says it uploads in parts (S3, GCS), else None (the filesystem's own default)."""
    if protocol_of_fs(fs).part_upload:
        return DEFAULT_UPLOAD_BLOCK_SIZE
    return None


def in_event_loop() -> bool:
    """Whether this thread runs an event loop (where a blocking network call would deadlock)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _abort_on_finalize(self: Any) -> None:
    """Finaliser of upload files: abort, never commit (fsspec's default would publish)."""
    if getattr(self, "closed", True):
        return
    path = getattr(self, "path", "?")
    log.warning("upload of %s was dropped without close(): aborted, nothing was published", path)
    abort_upload(self, network=not in_event_loop())


def make_abort_on_gc(f: Any) -> Any:
    """Switch an fsspec write file to a subclass whose finaliser aborts instead of committing."""
    from fsspec.spec import AbstractBufferedFile

    cls = type(f)
    if not isinstance(f, AbstractBufferedFile) or cls in _SAFE_CLASSES.values():
        return f
    safe = _SAFE_CLASSES.get(cls)
    if safe is None:
        safe = type(f"{cls.__name__}AbortOnGC", (cls,), {"__del__": _abort_on_finalize, "__module__": __name__})
        _SAFE_CLASSES[cls] = safe
    try:
        f.__class__ = safe
    except TypeError:  # a class with __slots__ or a C type: cannot be patched, leave it
        pass
    return f


def open_upload(fs: Any, path: str, *, block_size: int | None = DEFAULT_UPLOAD_BLOCK_SIZE, **kwargs: Any) -> Any:
    """Open `path` for a streaming upload from memory that commits only on close()."""
    if block_size:
        kwargs["block_size"] = block_size
    return make_abort_on_gc(fs.open(path, "wb", **kwargs))


def abort_upload(f: Any, *, network: bool = True) -> None:
    """Abort an upload in progress; the object is not created (or left as it was). Never raises.

    With `network=False` (finalisers, event-loop threads) the upload is only made unpublishable
    locally; S3 then keeps the unfinished multipart parts until the task's next start aborts them
    (storage.stale_uploads, as for a writer killed outright) or the bucket's lifecycle rule for
    incomplete uploads removes them (GCS expires unfinished resumable uploads after a week).
    """
    try:
        f.closed = True  # first: nothing may flush (and so complete) the upload from here on
    except Exception:  # noqa: BLE001
        pass
    if network:
        try:
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()
        except Exception as exc:  # noqa: BLE001 - best effort; the upload is unpublished either way
            log.info("abort of upload %s failed (%s); it was not published", getattr(f, "path", "?"),
                     describe(exc))
    try:
        f.buffer = None
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------------------------------------
# uploads a killed writer left open (Protocol.open_uploads; storage.stale_uploads decides which are dead)


@dataclass(frozen=True)
class OpenUpload:
    """One unfinished upload: the object (`bucket/key`) it would create and the store's id for it."""

    key: str
    upload_id: str


# S3: ListMultipartUploads / AbortMultipartUpload through s3fs's own client (its retries, its session)


def s3_open_uploads(fs: Any, folder: str) -> list[OpenUpload]:
    """Every unfinished multipart upload under `folder` (`bucket/prefix/`), as fs paths (`bucket/key`)."""
    from fsspec.asyn import sync

    return sync(fs.loop, _s3_list, fs, folder)


async def _s3_list(fs: Any, folder: str) -> list[OpenUpload]:
    bucket, prefix, _ = fs.split_path(folder)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxUploads": 1000}
    found: list[OpenUpload] = []
    while True:
        page = await fs._call_s3("list_multipart_uploads", **params)
        found.extend(OpenUpload(f"{bucket}/{u['Key']}", u["UploadId"]) for u in page.get("Uploads") or ())
        marker = (page.get("NextKeyMarker") or "", page.get("NextUploadIdMarker") or "")
        if not page.get("IsTruncated") or marker == (params.get("KeyMarker"), params.get("UploadIdMarker")):
            return found  # the last page (or a store that pages without moving on: never loop)
        params["KeyMarker"], params["UploadIdMarker"] = marker


def s3_abort_upload(fs: Any, upload: OpenUpload) -> None:
    """Abort one multipart upload: its parts are deleted and the key is left as it was."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(upload.key)
    sync(fs.loop, fs._call_s3, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id)
