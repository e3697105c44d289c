"""Listing an S3 folder's names without botocore building a dict per key.

`shardflow status` at 100k tasks lists records/ (100 ListObjectsV2 pages of 1,000 keys). botocore's
generic XML parser turns every key of a page into a dict of six fields, its LastModified through
dateutil: 60 ms of CPU a page here (20 ms without the timestamps), ~7 s of a status that should take
under 5. A run directory needs only the names, so for the listings made here the page's <Contents> and
<CommonPrefixes> blocks are cut out of the response before botocore parses it (a `before-parse` handler
on the s3fs client's event system) and handed back as bare {"Key": ...} / {"Prefix": ...} entries
through botocore's own `customized_response_dict`: the requests, signing, retries, error mapping and the
URL-decoding of keys (encoding-type=url) stay s3fs's and botocore's. The handler acts only inside
`names_in` (a context variable), so every other call of the shared client is parsed as before.
"""

from __future__ import annotations

import html
import re
from contextvars import ContextVar
from typing import Any

_LEAN: ContextVar[bool] = ContextVar("shardflow_lean_listing", default=False)
_EVENT = "before-parse.s3.ListObjectsV2"
_HANDLER_ID = "shardflow-lean-listing"
# XML text holds no raw "<": a key or prefix ends at the first one, a block at its first closing tag
_BLOCK = re.compile(rb"<(Contents|CommonPrefixes)>(.*?)</\1>", re.S)
_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_PREFIX = re.compile(rb"<Prefix>([^<]*)</Prefix>")


def _text(raw: bytes) -> str:
    """XML character data as text (the five entities and numeric references undone)."""
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


def lean_entries(body: bytes) -> tuple[bytes, list[dict[str, str]], list[dict[str, str]]]:
    """A ListObjectsV2 page split into (the page without its entries, Contents, CommonPrefixes).

    Contents entries carry only "Key"; a block without a key is dropped. Raises ValueError for a page
    whose blocks are not UTF-8 (the caller then leaves the page to botocore's parser)."""
    contents: list[dict[str, str]] = []
    prefixes: list[dict[str, str]] = []
    rest: list[bytes] = []
    at = 0
    for block in _BLOCK.finditer(body):
        rest.append(body[at:block.start()])
        at = block.end()
        inner = block.group(2)
        if block.group(1) == b"Contents":
            key = _KEY.search(inner)
            if key is not None:
                contents.append({"Key": _text(key.group(1))})
        else:
            prefix = _PREFIX.search(inner)
            if prefix is not None:
                prefixes.append({"Prefix": _text(prefix.group(1))})
    rest.append(body[at:])
    return b"".join(rest), contents, prefixes


def _lean_page(response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
    """botocore's before-parse hook: inside `names_in`, a successful page's entries are taken out."""
    if not _LEAN.get() or response_dict.get("status_code") != 200:
        return
    body = response_dict.get("body")
    if not isinstance(body, bytes):
        return
    try:
        stripped, contents, prefixes = lean_entries(body)
    except ValueError:  # not UTF-8: botocore's parser reports it as it would
        return
    response_dict["body"] = stripped
    customized_response_dict["Contents"] = contents
    customized_response_dict["CommonPrefixes"] = prefixes


def _hook(client: Any) -> None:
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is not None:
        events.register(_EVENT, _lean_page, unique_id=_HANDLER_ID)  # once per client: unique_id


async def names_in(fs: Any, path: str, prefix: str = "", *, page_size: int | None = None) -> list[str]:
    """Base names of the objects directly in folder `path` (s3fs `fs`) starting with `prefix`, in
    the store's order (subfolders are not listed); one ListObjectsV2 request per `page_size` keys (the
    store's maximum, 1,000 on S3, by default). FileNotFoundError for a missing bucket, other failures
    as s3fs raises them (after its retries)."""
    await fs.set_session()
    _hook(fs.s3)
    bucket, key, _ = fs.split_path(path)
    folder = f"{key.rstrip('/')}/" if key else ""
    params: dict[str, Any] = dict(Bucket=bucket, Prefix=folder + prefix, Delimiter="/", **fs.req_kw)
    if page_size is not None:
        params["MaxKeys"] = page_size
    names: list[str] = []
    token = _LEAN.set(True)
    try:
        while True:
            page = await fs._call_s3("list_objects_v2", **params)
            names.extend(entry["Key"][len(folder):] for entry in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                return names
            params["ContinuationToken"] = page["NextContinuationToken"]
    finally:
        _LEAN.reset(token)
