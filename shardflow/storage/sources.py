"""Byte ranges of ONE version of one remote object: what RemoteReader fetches its blocks from.

A source takes the object's identity once (`stat()`: size plus ETag on S3, generation on GCS,
whatever `info()` gives elsewhere) and serves ranges of exactly that version. S3 ranges are asked
with `If-Match: <etag at open>` and GCS ranges are pinned to the generation, so a replaced object is
an ObjectChangedError, never a mix of two versions; the generic source compares the identity again
(`check_unchanged()`) before every retry.

Which source a filesystem gets is named by the record of its protocol (`fs.protocol`, see
storage.protocols), like fsspec's own registry, not a guess from class names.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Callable

from shardflow.storage.local_files import ObjectChangedError
from shardflow.storage.options import options_for
from shardflow.storage.paths import Options, filesystem, is_local, local_path
from shardflow.storage.protocols import load, protocol_of_fs

_IDENTITY_KEYS = ("size", "ETag", "etag", "generation", "VersionId", "version_id", "md5Hash", "crc32c",
                  "LastModified", "mtime", "updated", "checksum")


def object_identity(info: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """What identifies one version of an object, from its `info()`: size plus ETag, generation, checksum
    or modification time, whichever the store gives (the reader pins ranges to it; `shardflow index`
    trusts a checkpoint entry only while it is unchanged)."""
    return tuple((k, str(info[k])) for k in _IDENTITY_KEYS if info.get(k) is not None)


def object_version(url: str, storage_options: Options = None) -> tuple[tuple[str, str], ...]:
    """The identity of the version of `url` there now (object_identity's rule): size and mtime of a local
    file, the store's `info()` (one HEAD, past fsspec's listing cache) of an object. Raises when the
    store cannot be asked. What the reader's cache checks a copy against, and what `shardflow index`
    trusts a checkpoint entry by."""
    if is_local(url):
        st = os.stat(local_path(url))
        return object_identity({"size": st.st_size, "mtime": st.st_mtime_ns})
    fs, path = filesystem(url, options_for(url, storage_options))
    try:
        fs.invalidate_cache(path)  # a listing (the spec's glob) may have cached an older info
    except Exception:  # noqa: BLE001 - a filesystem without a listing cache
        pass
    return object_identity(fs.info(path))


def _deleted(url: str) -> ObjectChangedError:
    return ObjectChangedError("object was deleted while it was being read", url=url)


def _sync(fs: Any, coro_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a coroutine of an async filesystem (s3fs) on its own event loop, from this thread."""
    from fsspec.asyn import sync

    return sync(fs.loop, coro_fn, *args, **kwargs)


def _fmt_identity(identity: tuple[Any, ...] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in identity or ()) or "unknown"


class ObjectSource:
    """Byte ranges of one object through any fsspec filesystem, pinned to the version seen by stat()."""

    def __init__(self, fs: Any, path: str, url: str) -> None:
        self.fs = fs
        self.path = path
        self.url = url
        self.size: int | None = None
        self.identity: tuple[Any, ...] | None = None

    def stat(self) -> None:
        try:
            self.fs.invalidate_cache(self.path)
        except Exception:  # noqa: BLE001 - a cache miss costs only a request
            pass
        info = self.info = self.fs.info(self.path)
        if info.get("type") == "directory":
            raise IsADirectoryError(self.path)
        size = info.get("size")
        # None: no size, or ranges refused ("Accept-Ranges: none"): read as one plain stream instead
        self.size = int(size) if size is not None and info.get("partial", True) is not False else None
        self.identity = object_identity(info)

    def fetch(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start=start, end=end)

    def close(self) -> None:
        """Let go of what the source holds open (nothing, for most stores)."""

    def check_unchanged(self) -> None:
        """Raise ObjectChangedError when the object is no longer the one opened."""
        before = self.identity
        try:
            self.stat()
        except FileNotFoundError as exc:
            raise _deleted(self.url) from exc
        if self.identity != before:
            raise ObjectChangedError(
                f"object changed while it was being read (was {_fmt_identity(before)}, now "
                f"{_fmt_identity(self.identity)})",
                url=self.url,
            )


class S3Source(ObjectSource):
    """S3 through s3fs: ranged GetObject with If-Match on the ETag seen at open."""

    def stat(self) -> None:
        bucket, key, version = self.fs.split_path(self.path)
        kw = {"VersionId": version} if version else {}
        head = _sync(self.fs, self.fs._call_s3, "head_object", Bucket=bucket, Key=key, **kw)
        self.size = int(head["ContentLength"])
        self.etag = head.get("ETag")
        self.version = version or None
        self.identity = (("size", str(self.size)), ("ETag", str(self.etag)))

    def fetch(self, start: int, end: int) -> bytes:
        return _sync(self.fs, self._fetch, start, end)

    async def _fetch(self, start: int, end: int) -> bytes:
        bucket, key, _ = self.fs.split_path(self.path)
        kw: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
        if self.etag:
            kw["IfMatch"] = self.etag
        if self.version:
            kw["VersionId"] = self.version
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        except FileNotFoundError as exc:
            raise _deleted(self.url) from exc
        except OSError as exc:
            text = str(exc).lower()
            if "precondition" in text or "pre-condition" in text or (
                exc.errno == errno.EINVAL and "match" in text
            ):
                raise ObjectChangedError(
                    "object changed while it was being read (ETag no longer matches)", url=self.url
                ) from exc
            raise
        try:
            etag = resp.get("ETag")
            if self.etag and etag and etag != self.etag:
                raise ObjectChangedError(
                    f"object changed while it was being read (ETag {self.etag} at open, {etag} now)",
                    url=self.url,
                )
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    def check_unchanged(self) -> None:
        before = (self.size, self.etag)
        try:
            self.stat()
        except FileNotFoundError as exc:
            raise _deleted(self.url) from exc
        if (self.size, self.etag) != before:
            raise ObjectChangedError(
                f"object changed while it was being read (size {before[0]}, ETag {before[1]} at open; "
                f"size {self.size}, ETag {self.etag} now)",
                url=self.url,
            )


class GCSSource(ObjectSource):
    """GCS through gcsfs: ranged media GETs pinned to the generation seen at open."""

    def stat(self) -> None:
        super().stat()
        self.generation = self.info.get("generation")

    def fetch(self, start: int, end: int) -> bytes:
        url = self.fs.url(self.path, generation=self.generation) if self.generation else self.fs.url(self.path)
        try:
            headers, data = self.fs.call("GET", url, headers={"Range": f"bytes={start}-{end - 1}"})
        except FileNotFoundError as exc:
            raise ObjectChangedError(
                f"object generation {self.generation} is gone: the object was replaced or deleted while "
                f"it was being read",
                url=self.url,
            ) from exc
        got = headers.get("x-goog-generation") if headers is not None else None
        if self.generation and got and str(got) != str(self.generation):
            raise ObjectChangedError(
                f"object changed while it was being read (generation {self.generation} at open, {got} now)",
                url=self.url,
            )
        return data


class HTTPSource(ObjectSource):
    """Plain HTTP(S) servers. Many (`python -m http.server`) ignore Range and answer 200 with the whole
    body: then the blocks are read, in order, from that one streamed body instead of asking again for
    each block (which would download the object once per block). A retry after a fault, or a seek
    backwards, starts a new GET and skips to the offset: slower, but still exact and bounded."""

    def __init__(self, fs: Any, path: str, url: str) -> None:
        super().__init__(fs, path, url)
        self._body: Any = None  # an aiohttp response the server sends whole, read block by block
        self._body_pos = 0
        self.ranges_ignored = False

    def fetch(self, start: int, end: int) -> bytes:
        return _sync(self.fs, self._fetch, start, end)

    def close(self) -> None:
        if self._body is not None:
            _sync(self.fs, self._drop_body)

    async def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()

    async def _fetch(self, start: int, end: int) -> bytes:
        if self._body is None or self._body_pos != start:
            await self._drop_body()
            kw = dict(self.fs.kwargs)
            headers = {**(kw.pop("headers", None) or {}), "Range": f"bytes={start}-{end - 1}"}
            session = await self.fs.set_session()
            resp = await session.get(self.fs.encode_url(self.path), headers=headers, **kw)
            if resp.status != 200:
                try:
                    self.fs._raise_not_found_for_status(resp, self.path)  # 404 -> FileNotFoundError, 5xx...
                    return await resp.read()  # 206: the range asked for
                finally:
                    resp.release()
            self.ranges_ignored = True  # 200: the whole body comes; read on from it
            self._body, self._body_pos = resp, 0
        try:
            await self._read_body(start - self._body_pos, keep=False)
            return await self._read_body(end - start, keep=True)
        except BaseException:
            await self._drop_body()
            raise

    async def _read_body(self, n: int, *, keep: bool) -> bytes:
        """The next `n` bytes of the streamed body (fewer at its end); discarded unless `keep`."""
        out = bytearray()
        left = n
        while left > 0:
            chunk = await self._body.content.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
            self._body_pos += len(chunk)
            if keep:
                out += chunk
        if left > 0:
            await self._drop_body()  # ended early: RemoteReader reports the short read
        return bytes(out)


def make_source(fs: Any, path: str, url: str) -> ObjectSource:
    """The source for `path` on `fs`: the store-specific one its protocol's record names, else the
    generic one (also when `fs` lacks the method that source relies on: another library owns the name)."""
    record = protocol_of_fs(fs)
    if record.source is not None and hasattr(fs, record.source_needs):
        return load(record.source)(fs, path, url)
    return ObjectSource(fs, path, url)
