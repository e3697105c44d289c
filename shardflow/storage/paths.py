"""Small URL helpers shared by every storage module: a URL's protocol, local paths, joining, and the
fsspec filesystem behind a URL.

None of these imports fsspec at module level, so code that only needs to tell a local path from a
URL (the protocol records, the shard writer) does not pay for loading it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from shardflow.errors import ShardIOError
from shardflow.storage.options import options_for
from shardflow.storage.retry import describe

if TYPE_CHECKING:
    import fsspec

Options = Mapping[str, Any] | None

_LOCAL_PREFIXES = ("file://", "local://")


def protocol(url: str) -> str:
    """The fsspec protocol of a URL ('file' for plain paths, 'pipe' for `pipe:` commands)."""
    if url.startswith("pipe:"):
        return "pipe"
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0]


def is_local(url: str) -> bool:
    """Whether `url` names a file on this machine (a plain path, `file://` or `local://`)."""
    return protocol(url) in ("file", "local")


def local_path(url: str) -> str:
    """The filesystem path of a local URL (`file:///x` and `local:///x` are `/x`)."""
    for prefix in _LOCAL_PREFIXES:
        if url.startswith(prefix):
            return url[len(prefix):]
    return url


def join(base: str, *names: str) -> str:
    """Join path parts onto a URL or path with '/' (object stores have no other separator)."""
    out = base.rstrip("/")
    for name in names:
        out = f"{out}/{name.strip('/')}"
    return out


def filesystem(url: str, storage_options: Options = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and path within it for `url` (options resolved for that URL)."""
    import fsspec.core

    options = options_for(url, storage_options)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError, TypeError) as exc:
        raise ShardIOError(f"cannot use this URL: {describe(exc, options)}", url=url) from exc


def fs_protocols(fs: Any) -> tuple[str, ...]:
    """Every protocol name of a filesystem (s3fs: 's3', 's3a'): what per-store tables are keyed on."""
    names = fs.protocol
    return tuple(names) if isinstance(names, (tuple, list)) else (names,)
