"""A bounded local cache of remote shards for the training reader.

The first read of a remote shard streams it as usual and copies the bytes into a hidden temp file
beside the cache entry as they pass; only a shard read to its end (and matching the size and sha256
the manifest gives, when it gives them) is renamed to its entry, so the cache never holds a partial
or corrupt shard and nobody waits for a download before the first sample. Later epochs read the
local file. The cache is bounded in bytes: before a new entry is added, the least recently used
entries (by mtime, refreshed on every hit) are deleted until it fits. Several processes (DataLoader
workers, ranks on one host) may share a directory: entries appear by atomic rename, and a reader that
loses a race with eviction just reads from the remote again.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import warnings
from typing import Any, BinaryIO, Callable

from shardflow.storage.atomic import is_temp_name, temp_name

STALE_TEMP_SECONDS = 3600
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

    def path_for(self, url: str) -> str:
        digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]
        base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return os.path.join(self.directory, f"{digest}-{base}")

    def open(
        self,
        url: str,
        open_remote: Callable[[], BinaryIO],
        *,
        nbytes: int | None = None,
        sha256: str | None = None,
    ) -> BinaryIO:
        """A stream of the shard: the cached copy when there is a good one, else the remote stream
        teed into the cache."""
        path = self.path_for(url)
        try:
            f = open(path, "rb", buffering=1 << 20)
        except FileNotFoundError:
            pass
        else:
            if nbytes is None or os.fstat(f.fileno()).st_size == nbytes:
                try:
                    os.utime(path)  # recency for LRU eviction
                except OSError:
                    pass
                return f  # type: ignore[return-value]
            f.close()
            self._unlink(path)  # stale copy (the shard was rewritten)
        remote = open_remote()
        if nbytes is not None and nbytes > self.max_bytes:
            return remote
        return _Tee(remote, self, path, nbytes, sha256, url)  # type: ignore[return-value]

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


class _Tee:
    """Reads from `remote` and copies what it reads into a temp file; `finish()` drains the rest
    and commits the copy; `close()` without finish throws the copy away."""

    def __init__(
        self, remote: Any, cache: ShardCache, path: str, nbytes: int | None, sha256: str | None, url: str = ""
    ) -> None:
        self._remote = remote
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
