"""Conditional writes: put a small object only if it is absent, or only if it is still the version read.

This is what makes a lease on an object store a lease (rundir.lease): two drivers that both saw a
dead holder both try `put_if(..., version_read)`, and the store lets exactly one of them through.
What each store guarantees (the protocol's record names its `conditional_put`, storage.protocols):

- S3 (and S3-compatible stores that implement it: SeaweedFS, MinIO, recent Ceph RGW): PutObject with
  `If-None-Match: *` (create only) and `If-Match: <ETag>` (replace only that version), strongly
  consistent since 2020; a store that ignores the headers is not safe this way (AWS honours them
  since 2024).
- GCS: uploads with `ifGenerationMatch` (0: create only; else the generation read).
- Anything else (az, http, ...): no conditional write here: the lease falls back to a PUT read back
  after a settle time, which catches two humans typing `shardflow run` at once but is no consensus.
  Local run directories use O_EXCL / link / rename instead (rundir.lease).
"""

from __future__ import annotations

import json
from typing import Any

PRECONDITION_MARKS = ("precondition", "pre-condition", "conditionalrequestconflict", "412")


def lost_condition(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) is the store refusing a conditional write (HTTP 412/409)."""
    cur: BaseException | None = exc
    for _ in range(8):
        if cur is None:
            break
        status = getattr(cur, "status", None) or getattr(cur, "code", None)
        response = getattr(cur, "response", None)
        code = (response.get("Error") or {}).get("Code", "") if isinstance(response, dict) else ""
        if status in (412, "412") or code in ("PreconditionFailed", "ConditionalRequestConflict") or any(
                mark in f"{type(cur).__name__} {cur}".lower() for mark in PRECONDITION_MARKS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def s3_version(fs: Any, path: str) -> str | None:
    """The ETag of the object at `path` now (None when absent)."""
    try:
        return fs.info(path, refresh=True).get("ETag")
    except FileNotFoundError:
        return None


def s3_put_if(fs: Any, path: str, data: bytes, version: str | None) -> str | None:
    """PUT `data` if `path` is absent (version None) or still has ETag `version`: the new ETag, or None
    when the store refused (someone else wrote first)."""
    condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
    try:
        response = fs.pipe_file(path, data, **condition)
    except FileNotFoundError:  # If-Match on an object deleted since (the lease was released by its taker)
        return None
    except OSError as exc:
        if lost_condition(exc):
            return None
        raise
    tag = (response or {}).get("ETag") if isinstance(response, dict) else None
    return tag or s3_version(fs, path)


def gcs_version(fs: Any, path: str) -> str | None:
    """The generation of the object at `path` now (None when absent)."""
    try:
        generation = fs.info(path, refresh=True).get("generation")
    except FileNotFoundError:
        return None
    return None if generation is None else str(generation)


def gcs_put_if(fs: Any, path: str, data: bytes, version: str | None) -> str | None:
    """Upload `data` with ifGenerationMatch (0 when absent): the new generation, or None when refused."""
    from urllib.parse import quote

    bucket, key, _ = fs.split_path(path)
    inner = getattr(fs, "_fs", fs)  # storage.retrying_fs wraps it: the call itself is not retried here
    # a multipart upload (the JSON API's metadata part, then the bytes): the form every GCS implementation
    # honours preconditions on
    boundary = "shardflow-lease-boundary"
    body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps({'name': key})}\r\n"
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + data + f"\r\n--{boundary}--".encode()
    try:
        answer = inner.call("POST", f"{inner._location}/upload/storage/v1/b/{quote(bucket)}/o",
                            uploadType="multipart", ifGenerationMatch=version or "0", data=body, json_out=True,
                            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'})
    except (FileExistsError, FileNotFoundError):  # gcsfs's words for HTTP 412, and 404 (deleted since)
        return None
    inner.invalidate_cache(path)
    return str(answer.get("generation")) if isinstance(answer, dict) and answer.get("generation") else \
        gcs_version(fs, path)
