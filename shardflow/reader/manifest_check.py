"""A manifest checked against the shards it describes, as they are opened.

The split trusts the manifest's sample counts (reader/split.py): a shard rewritten after it was
indexed (more samples, fewer) would otherwise be read by its old count without a word: samples past
the recorded count never read, missing ones made up by repeating others. Opening a shard tells the
reader its size at no cost (the stream's stat, or its file's), so each open compares it with the
size the manifest recorded (`nbytes`) and reports a mismatch under the error policy: on_error="raise"
stops there; "warn" (the default) and "skip" count it and read the shard by the recorded count.

Only the size is compared: the manifest records no version identity (ETag, mtime) of its own, and
hashing a shard (`sha256`) would mean reading it whole first. A rewrite to the very same size goes
unnoticed here (the cache still checks sha256 on the copies it keeps).
"""

from __future__ import annotations

import io
import os
import stat
from typing import Any, Callable, Iterator, Sequence

from shardflow.errors import ShardflowError, apply_policy
from shardflow.reader.manifest import ShardManifest

ReadSamples = Callable[..., Iterator[dict]]


class StaleManifestError(ShardflowError):
    """A shard's size now differs from the size its manifest recorded: its sample count is stale."""


def stream_size(stream: Any) -> int | None:
    """The size of the object behind an open shard stream, when it says without a read: a remote
    reader's or fsspec file's `size`, a regular file's fstat; None for pipes and wrappers."""
    size = getattr(stream, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def stale_reason(actual: int, recorded: int, nsamples: int, source: str | None) -> str:
    """The one-line reason of a StaleManifestError (the error adds the shard's URL)."""
    return (f"{actual} bytes now, but the manifest {source} records {recorded} bytes and {nsamples} samples: "
            "the shard changed after it was indexed; it is read by the recorded count (samples past it are "
            "not read, missing ones are made up from others under equalize=/epoch_size=); index it again "
            "(`shardflow index`)")


def size_checked(read: ReadSamples, urls: Sequence[str], manifest: ShardManifest) -> ReadSamples:
    """`read` (read_samples' signature) that first compares each shard's size with the manifest's."""
    if manifest.counts is None or not manifest.nbytes or all(n is None for n in manifest.nbytes):
        return read
    recorded = {url: (nbytes, n) for url, nbytes, n in zip(urls, manifest.nbytes, manifest.counts)
                if nbytes is not None}

    def read_checked(stream: Any, url: str, *, on_error: str, report: Any = None, **kwargs: Any) -> Iterator[dict]:
        entry = recorded.get(url)
        if entry is not None:
            actual = stream_size(stream)
            if actual is not None and actual != entry[0]:
                error = StaleManifestError(stale_reason(actual, entry[0], entry[1], manifest.source), url=url)
                apply_policy(error, on_error, report, stacklevel=4)
        return read(stream, url, on_error=on_error, report=report, **kwargs)

    return read_checked


__all__ = ["StaleManifestError", "size_checked", "stale_reason", "stream_size"]
