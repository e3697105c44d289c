"""What the reader knows about its shards before opening them: sample counts, sizes, sha256.

A job's run directory lists every shard it wrote (`_shardflow/summary.json`). With those counts the
reader can split an epoch by samples instead of by shards (equal counts per rank, len()), and its
cache can check a downloaded shard against the recorded size and hash.

A dataset spec's collections often share one folder (and so one summary.json): a `ManifestCache`
passed to every collection's load reads and indexes each summary once (by URL and by file name), so
C collections over N shards cost O(N + C) instead of O(C x N).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from shardflow.errors import ShardIOError
from shardflow.rundir.layout import SUMMARY, summary_beside
from shardflow.storage.paths import is_local, join, local_path
from shardflow.storage.schemes import open_read


@dataclass(frozen=True)
class ShardManifest:
    """Per shard, in shard order: sample count, and (when recorded) byte size and sha256."""

    source: str | None  # where the entries came from ("<list>", a summary.json URL); None: no manifest
    counts: list[int] | None
    nbytes: list[int | None] | None
    sha256: list[str | None] | None

    @classmethod
    def load(cls, manifest: Any, shard_urls: Sequence[str], storage_options: Any = None,
             cache: ManifestCache | None = None) -> ShardManifest:
        """The manifest of `shard_urls` (see load_manifest for what `manifest` may be)."""
        entries, source = load_manifest(manifest, shard_urls, storage_options, cache)
        if entries is None:
            return cls(None, None, None, None)
        return cls(
            source,
            [int(e["nsamples"]) for e in entries],
            [e.get("nbytes") for e in entries],
            [e.get("sha256") for e in entries],
        )


def summary_url(shard_url: str) -> str:
    """Where a job's run directory keeps the manifest of the shards beside `shard_url`."""
    return summary_beside(_dirname(shard_url))


@dataclass
class ManifestIndex:
    """One manifest's entries, parsed and indexed once: by normalised URL and by file name."""

    source: str
    base_dir: str | None  # the outputs directory the entries are relative to (None: a list)
    by_url: dict[str, dict[str, Any]]
    by_name: dict[str, dict[str, Any]]

    @classmethod
    def build(cls, entries: list[Any], source: str, base_dir: str | None) -> ManifestIndex:
        by_url: dict[str, dict[str, Any]] = {}
        by_name: dict[str, dict[str, Any]] = {}
        for e in entries:
            if not isinstance(e, dict) or "url" not in e or "nsamples" not in e:
                continue
            by_url[_norm_url(str(e["url"]))] = e
            by_name.setdefault(str(e["url"]).rsplit("/", 1)[-1], e)
        return cls(source, None if base_dir is None else _norm_url(base_dir), by_url, by_name)

    def match(self, shard_urls: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """(the entry of each shard found, the shards without one): by URL, or by file name for shards
        in the directory the run wrote to (a run directory that moved with its shards)."""
        out = []
        missing = []
        for url in shard_urls:
            e = self.by_url.get(_norm_url(url))
            if e is None and self.base_dir is not None and _norm_url(_dirname(url)) == self.base_dir:
                e = self.by_name.get(url.rsplit("/", 1)[-1])
            if e is None:
                missing.append(url)
            else:
                out.append(e)
        return out, missing


ManifestCache = dict  # source (or id of a list) -> ManifestIndex | None: what one load has read


def load_manifest(
    manifest: Any, shard_urls: Sequence[str], storage_options: Any = None, cache: ManifestCache | None = None
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The manifest entry of every shard, in shard order, and where it came from; (None, None) when
    there is no usable manifest.

    `manifest`: None (look for `<dir of first shard>/_shardflow/summary.json`, used only if it lists
    every shard), a run-directory or summary.json URL, a list of {"url", "nsamples", ...} entries
    (ShardInfo.to_json()), or False (never look). `cache` (a dict kept over several calls) reads and
    indexes each manifest once.
    """
    if manifest is False:
        return None, None
    explicit = manifest is not None
    index = _index(manifest, shard_urls, storage_options, {} if cache is None else cache)
    if index is None:
        return None, None
    out, missing = index.match(shard_urls)
    if missing:
        if explicit:
            raise ValueError(
                f"manifest {index.source} does not list {len(missing)} of the {len(shard_urls)} shards, "
                f"e.g. {missing[0]}"
            )
        return None, None
    return out, index.source


def _index(manifest: Any, shard_urls: Sequence[str], storage_options: Any,
           cache: ManifestCache) -> ManifestIndex | None:
    """The indexed manifest for these shards, read once per source through `cache`."""
    key = id(manifest) if isinstance(manifest, (list, tuple)) else _source(manifest, shard_urls)
    if key not in cache:
        found = _read_entries(manifest, shard_urls, storage_options)
        cache[key] = None if found is None else ManifestIndex.build(*found)
    return cache[key]


def _source(manifest: Any, shard_urls: Sequence[str]) -> str:
    if manifest is None:
        return summary_url(shard_urls[0])
    source = str(manifest)
    return source if source.endswith(".json") else join(source, SUMMARY)


def _read_entries(
    manifest: Any, shard_urls: Sequence[str], storage_options: Any
) -> tuple[list[Any], str, str | None] | None:
    """(entries, source, the outputs directory they are relative to), or None when an implicit
    manifest is missing or unusable; an explicit one that cannot be read raises."""
    if isinstance(manifest, (list, tuple)):
        return [e.to_json() if hasattr(e, "to_json") else dict(e) for e in manifest], "<list>", None
    explicit = manifest is not None
    source = _source(manifest, shard_urls)
    try:
        data = _read_json(source, storage_options)
    except (ShardIOError, OSError, ValueError) as exc:
        if explicit:
            raise ShardIOError(f"cannot read the manifest: {exc}", url=source) from exc
        return None
    entries = data.get("shards") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        if explicit:
            raise ValueError(f"manifest {source} has no 'shards' list")
        return None
    return entries, source, _dirname(_dirname(source))  # the outputs directory the run dir sits in


def _norm_url(url: str) -> str:
    if is_local(url):
        return os.path.abspath(local_path(url))
    return url.rstrip("/")


def _dirname(url: str) -> str:
    return url.rsplit("/", 1)[0] if "/" in url else "."


def _read_json(url: str, storage_options: Any) -> Any:
    with open_read(url, storage_options) as f:
        return json.loads(f.read())
