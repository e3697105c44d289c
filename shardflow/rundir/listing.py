"""Reading a run directory at scale: one listing per folder, batched reads, exact temp cleanup.

Everything here costs O(listing) requests, never a request or a cache scan per task: a folder is
listed once (paginated by the store, 1,000 keys a request on S3) and not kept in the filesystem's
listing cache, and files are fetched concurrently in batches (object stores) or opened directly
(local). RunDir uses these; nothing else needs to know how.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Iterator

from shardflow.rundir.state_files import loads
from shardflow.storage.atomic import is_own_temp
from shardflow.storage.protocols import lean_lister, protocol_of_fs
from shardflow.storage.retrying_fs import RetryingFileSystem

TEMP_TAG = "sfrun"  # the tag in run-directory temp names: `.<name>.tmp-sfrun-<12 hex>`
READ_BATCH = 1_000  # files fetched concurrently at a time from object stores
PREFIX_SPAN = 1_000  # task ids per concurrent prefix listing (list_task_folder): about one page each
PREFIXES_IN_FLIGHT = 32  # prefix listings at once



def list_folder(fs: Any, path: str, *, local: bool, prefix: str = "") -> list[str]:
    """Sorted visible base names in `path` that start with `prefix` (empty when it does not exist),
    uncached. Stores that list by key prefix are asked for those names only."""
    if local:
        try:
            with os.scandir(path) as entries:
                return sorted(e.name for e in entries if e.name.startswith(prefix) and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
    if _by_prefix(fs) and (prefix or lean_lister(fs) is not None):
        return _list_prefixes(fs, path, [prefix])
    fs.invalidate_cache(path)  # a listing cached earlier in this process may be stale
    try:
        entries = fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    finally:
        fs.invalidate_cache(path)  # and N cached entries would be scanned before every later read
    own = path.rstrip("/")  # some stores list an emptied folder as itself
    names = (e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != own)
    return sorted(n for n in names if n.startswith(prefix) and n and not n.startswith("."))


def list_task_folder(fs: Any, path: str, *, local: bool, tasks: int) -> list[str]:
    """list_folder for a folder of about one name per task, each starting with its 6-digit task id below
    `tasks` (done/, records/): on stores that list by key prefix, one listing per PREFIX_SPAN ids (`000`,
    `001`, ...), all in flight at once. The same requests as one listing (1,000 names each), in the time of
    one or two instead of tasks / 1,000 pages one after another. Names that do not start so are not listed."""
    prefixes = -(-tasks // PREFIX_SPAN)
    if local or prefixes <= 2 or tasks > 10**6 or not _by_prefix(fs):
        return list_folder(fs, path, local=local)
    return _list_prefixes(fs, path, [f"{p:03d}" for p in range(prefixes)])


def _by_prefix(fs: Any) -> bool:
    return protocol_of_fs(fs).listing_by_prefix and (lean_lister(fs) is not None or hasattr(fs, "_find"))


def _list_prefixes(fs: Any, path: str, prefixes: list[str]) -> list[str]:
    """Sorted visible names in `path` starting with one of `prefixes` (listed PREFIXES_IN_FLIGHT at a time),
    retried per the run directory's policy; names only where the protocol has a lean listing."""
    from fsspec.asyn import sync

    lean = lean_lister(fs)

    async def listed(prefix: str) -> list[str]:
        if lean is not None:  # no listing cache, no dict per key (storage.s3_listing)
            return await lean(fs, path, prefix)
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in await fs._find(path, maxdepth=1, withdirs=False,
                                                                          prefix=prefix)]

    async def each_prefix() -> list[str]:
        names: list[str] = []
        for first in range(0, len(prefixes), PREFIXES_IN_FLIGHT):  # bounded: fsspec's entries are big dicts
            pages = await asyncio.gather(*(listed(p) for p in prefixes[first:first + PREFIXES_IN_FLIGHT]))
            names.extend(name for page in pages for name in page)
        return names

    try:
        found = _retried(fs, "ls", sync, fs.loop, each_prefix)
    except FileNotFoundError:
        return []
    return sorted(n for n in found if n and not n.startswith("."))


def _retried(fs: Any, name: str, func: Callable[..., Any], *args: Any) -> Any:
    """`func(*args)` under the run directory's retry policy when `fs` has one (storage.retrying_fs)."""
    return fs.retried(name, func, *args) if isinstance(fs, RetryingFileSystem) else func(*args)


def iter_files(fs: Any, paths: list[str], *, local: bool, parse: bool = True) -> Iterator[Any]:
    """Contents of `paths` in order (parsed JSON, or text); None for a file gone meanwhile."""
    if not paths:
        return
    if local:
        for path in paths:
            yield _decode(_read_local(path), parse, path)
        return
    for start in range(0, len(paths), READ_BATCH):
        batch = paths[start : start + READ_BATCH]
        found = {fs._strip_protocol(k): v for k, v in fs.cat(batch, on_error="omit", **cat_options(fs)).items()}
        for path in batch:
            yield _decode(found.get(fs._strip_protocol(path)), parse, path)


def cat_options(fs: Any) -> dict[str, Any]:
    """Keyword arguments for reading a small file in one request: s3fs would first HEAD every file to
    decide whether to fetch it in parallel ranges (two requests per marker)."""
    return {"max_concurrency": 1} if protocol_of_fs(fs).cat_in_one_request else {}


def read_files(fs: Any, paths: list[str], *, local: bool, parse: bool = True) -> list[Any]:
    return list(iter_files(fs, paths, local=local, parse=parse))


def _read_local(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _decode(data: bytes | None, parse: bool, path: str) -> Any:
    if data is None:
        return None
    # unparseable: one line naming the file (parse=False: its reader judges the text; undecodable bytes shown)
    return loads(data, path) if parse else data.decode(errors="replace")


def remove_own_temps(root: str, folders: tuple[str, ...], tag: str) -> int:
    """Delete `.<name>.tmp-<tag>-<12 hex>` files (exactly that form) directly in `root`/`folders`."""
    removed = 0
    for folder in folders:
        try:
            with os.scandir(os.path.join(root, folder) if folder else root) as entries:
                stale = [e.path for e in entries if is_own_temp(e.name, tag) and e.is_file(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        for path in stale:
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


class KnownNames:
    """What this process knows is in a few run-dir folders: each listed once, then kept up to date with
    this process's own writes. Lets a task skip the DELETE of a failure record or an error log that
    does not exist (two requests per task on object stores). A record another process wrote after the
    listing may then stay beside a done marker: readers let the done marker win."""

    def __init__(self, lister: Callable[[str], list[str]]) -> None:
        self._lister = lister
        self._folders: dict[str, set[str]] = {}

    def may_exist(self, name: str) -> bool:
        folder, _, base = name.rpartition("/")
        if folder not in self._folders:
            self._folders[folder] = set(self._lister(folder))
        return base in self._folders[folder]

    def add(self, name: str) -> None:
        folder, _, base = name.rpartition("/")
        if folder in self._folders:
            self._folders[folder].add(base)

    def discard(self, name: str) -> None:
        folder, _, base = name.rpartition("/")
        self._folders.get(folder, set()).discard(base)
