"""A bounded local cache of remote shards for the training reader.

The first read of a remote shard streams it as usual and copies the bytes into a hidden temp file
beside the cache entry as they pass; only a shard read to its end (and matching the size and sha256
the manifest gives, when it gives them) is renamed to its entry, so the cache never holds a partial
or corrupt shard and nobody waits for a download before the first sample. Later epochs read the
local file. The cache is bounded in bytes: before a new entry is added, the least recently used
entries (by mtime, refreshed on every hit) are deleted until it fits. Several processes (DataLoader
workers, ranks on one host) may share a directory: entries appear by atomic rename, and a reader that
loses a race with eviction just reads from the remote again.

An entry copies ONE version of its object: its name holds a hash of the object's identity
(storage.sources.object_identity: size + mtime of a local file, size + ETag / generation /
modification time on an object store) taken before the copy was read, and a hit is used only while
the remote's identity is still that one. So every open of a cached shard costs one `info()` (a HEAD),
negligible next to reading a shard of 100s of MB, and a shard rewritten under the same URL is read
again instead of serving its old bytes forever. A new version comes in under its own name by temp +
rename (a reader of the old entry keeps its open file); the old version's entries are deleted. When
the store cannot be asked (down, credentials gone, the object deleted), the newest cached copy is
used with a warning naming the shard, once per process: training goes on with the last version seen,
which is what a cache is for; after a failure of the store itself (not one missing object) its copies
are used unchecked for UNREACHABLE_SECONDS, so an outage costs one client timeout a minute, not one
per shard open. A store that gives nothing identifying a version is not cached. Entries of older
shardflow versions (no identity in their name) are a miss, deleted when their shard is read again:
nothing says which version they copy, and a check by size alone would miss a rewrite of the same
size (one download per shard after an upgrade is the price).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import warnings
from typing import Any, BinaryIO, Callable

from shardflow.reader.warn_once import warn_once
from shardflow.storage.atomic import is_temp_name, temp_name

Identity = tuple[tuple[str, str], ...]
VERSION_MARK = "@"  # entry names: <url hash>@<identity hash>-<name>; older versions: <url hash>-<name>

STALE_TEMP_SECONDS = 3600
UNREACHABLE_SECONDS = 60.0  # after a store failed a version check, its cached copies are used unchecked this long
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(size: int | float | str) -> int:
    """Bytes from an int or a string such as '20GB', '512 MiB'."""
    if isinstance(size, (int, float)):
        return int(size)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", size)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read a size from {size!r} (use e.g. 20GB or 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class ShardCache:
    """Local copies of remote shards under `directory`, at most `max_bytes` in total."""

    def __init__(self, directory: str, max_bytes: int | str = "20GB") -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.max_bytes = parse_size(max_bytes)
        os.makedirs(self.directory, exist_ok=True)
        self._remove_stale_temps()
        # store (scheme://bucket) -> (until when, why) its version checks are skipped after one failed
        self._unreachable: dict[str, tuple[float, str]] = {}

    def path_for(self, url: str, identity: Identity) -> str:
        """The entry of `url` at version `identity`."""
        version = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"{self._url_hash(url)}{VERSION_MARK}{version}-{_base(url)}")

    def open(
        self,
        url: str,
        open_remote: Callable[[], BinaryIO],
        *,
        version: Callable[[], Identity],
        nbytes: int | None = None,
        sha256: str | None = None,
    ) -> BinaryIO:
        """A stream of the shard: the cached copy of the remote's current version when there is a good
        one, else the remote stream teed into the cache. `version()` is the remote's identity now (it
        raises when the store cannot be asked)."""
        if nbytes is not None and nbytes > self.max_bytes:
            return open_remote()  # never fits: not worth a HEAD
        store = _store_of(url)
        unreachable = self._unreachable.get(store)
        if unreachable is not None and time.monotonic() < unreachable[0]:
            return self._open_unchecked(url, open_remote, nbytes, unreachable[1])  # no wait per shard
        try:
            identity = version()
        except Exception as exc:  # noqa: BLE001 - any store failure: the last copy seen, said once
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            if not isinstance(exc, FileNotFoundError):  # the store itself failed, not this one object
                self._unreachable[store] = (time.monotonic() + UNREACHABLE_SECONDS, reason)
            return self._open_unchecked(url, open_remote, nbytes, reason)
        self._unreachable.pop(store, None)
        if not identity:
            warn_once(f"shard {url}: not cached (its store gives nothing that identifies a version: no size, "
                      "ETag or modification time)")
            return open_remote()
        path = self.path_for(url, identity)
        f = self._open_entry(path, nbytes)
        if f is not None:
            return f
        self._unlink(self._unversioned_path(url))  # an older shardflow's copy: nothing says which version
        for other in self._versions_of(url):  # older versions: stale now
            if other != path:
                self._unlink(other)
        return _Tee(open_remote(), self, path, nbytes, sha256, url)  # type: ignore[return-value]

    def _open_unchecked(self, url: str, open_remote: Callable[[], BinaryIO], nbytes: int | None,
                        reason: str) -> BinaryIO:
        """The newest cached copy of `url` when its store could not say its version; else the remote
        (uncached: with no version there is no name to keep it under), whose own error names the shard."""
        for path in sorted(self._versions_of(url), key=_mtime, reverse=True):
            f = self._open_entry(path, nbytes)
            if f is not None:
                warn_once(f"shard {url}: its store could not be asked for its version ({reason}); reading the "
                          "cached copy, which may be out of date")
                return f
        return open_remote()

    def _open_entry(self, path: str, nbytes: int | None) -> BinaryIO | None:
        """The entry at `path` opened, or None when it is missing or not the manifest's size."""
        try:
            f = open(path, "rb", buffering=1 << 20)
        except FileNotFoundError:
            return None
        if nbytes is not None and os.fstat(f.fileno()).st_size != nbytes:
            f.close()
            self._unlink(path)  # not the shard the manifest describes
            return None
        try:
            os.utime(path)  # recency for LRU eviction
        except OSError:
            pass
        return f  # type: ignore[return-value]

    def _versions_of(self, url: str) -> list[str]:
        """Every entry of `url` (any version). A listing: only on a miss, which reads a whole shard."""
        prefix = f"{self._url_hash(url)}{VERSION_MARK}"
        with os.scandir(self.directory) as it:
            return [e.path for e in it if e.name.startswith(prefix)]

    def _unversioned_path(self, url: str) -> str:
        return os.path.join(self.directory, f"{self._url_hash(url)}-{_base(url)}")

    @staticmethod
    def _url_hash(url: str) -> str:
        return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]

    def entries(self) -> list[tuple[str, int, float]]:
        """(path, size, mtime) of every complete entry."""
        out = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.startswith(".") or not e.is_file():
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                out.append((e.path, st.st_size, st.st_mtime))
        return out

    def size(self) -> int:
        return sum(s for _, s, _ in self.entries())

    def make_room(self, need: int) -> bool:
        """Evict least recently used entries until `need` more bytes fit; False if they never can."""
        if need > self.max_bytes:
            return False
        entries = sorted(self.entries(), key=lambda e: e[2])
        total = sum(s for _, s, _ in entries)
        for path, size, _ in entries:
            if total + need <= self.max_bytes:
                break
            self._unlink(path)
            total -= size
        return total + need <= self.max_bytes

    def commit(self, temp: str, path: str, size: int) -> None:
        if self.make_room(size):
            os.replace(temp, path)
        else:
            self._unlink(temp)

    def _remove_stale_temps(self) -> None:
        now = time.time()
        with os.scandir(self.directory) as it:
            for e in it:
                if is_temp_name(e.name):
                    try:
                        if now - e.stat().st_mtime > STALE_TEMP_SECONDS:
                            os.unlink(e.path)
                    except FileNotFoundError:
                        pass

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _store_of(url: str) -> str:
    """`scheme://bucket-or-host` of `url`: what one outage takes away as a whole."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.split('/', 1)[0]}" if sep else url


def _base(url: str) -> str:
    """The readable end of an entry's name: the shard's file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


class _Tee:
    """Reads from `remote` and copies what it reads into a temp file; `finish()` drains the rest
    and commits the copy; `close()` without finish throws the copy away."""

    def __init__(
        self, remote: Any, cache: ShardCache, path: str, nbytes: int | None, sha256: str | None, url: str = ""
    ) -> None:
        self._remote = remote
        self.size = getattr(remote, "size", None)  # the object's size, as the remote stream says (manifest_check)
        self._path_url = url or path
        self._cache = cache
        self._path = path
        self._nbytes = nbytes
        self._sha256 = sha256
        self._hash = hashlib.sha256() if sha256 else None
        self._temp = temp_name(path)
        self._out: Any = open(self._temp, "wb", buffering=1 << 20)
        self._size = 0
        self._eof = False
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        data = self._remote.read(n)
        if data:
            self._out.write(data)
            self._size += len(data)
            if self._hash is not None:
                self._hash.update(data)
        if not data or n is None or n < 0:
            self._eof = True
        return data

    def finish(self) -> None:
        """The reader got everything it wanted: read what is left (tar padding) and commit."""
        while not self._eof:
            self.read(1 << 20)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._remote.close()
        finally:
            self._out.close()
            good = self._eof and (self._nbytes is None or self._size == self._nbytes) and (
                self._hash is None or self._hash.hexdigest() == self._sha256
            )
            if good:
                self._cache.commit(self._temp, self._path, self._size)
            else:
                self._cache._unlink(self._temp)
                if self._eof:
                    warnings.warn(
                        f"shard {self._path_url} does not match its manifest (size {self._size}, expected "
                        f"{self._nbytes}; or a different sha256): not cached",
                        stacklevel=2,
                    )

    def __enter__(self) -> "_Tee":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
