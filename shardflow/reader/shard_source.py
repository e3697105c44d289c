"""Raw samples of a consumer's shards: open each shard (through the local cache), read its segment.

A shard that cannot be opened is always an error naming it (whatever on_error says): a missing
shard is a broken dataset, not a bad sample. Damage inside a shard ends that shard and is counted
under the error policy; the samples before it are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from shardflow.errors import ShardflowError, ShardIOError
from shardflow.reader.cache import ShardCache
from shardflow.reader.layout import EpochPlan
from shardflow.reader.manifest import ShardManifest
from shardflow.reader.settings import ReaderSettings
from shardflow.reader.split import TAG_RESAMPLE, Segment, resampled_shards, rng_for
from shardflow.reader.state import ErrorCount
from shardflow.reader.warn_once import warn_once
from shardflow.shards.samples import read_samples
from shardflow.storage.locate import Locator, resolve
from shardflow.storage.paths import is_local
from shardflow.storage.schemes import open_read
from shardflow.storage.sources import object_version


@dataclass(frozen=True)
class ShardSource:
    """Reads the shards of one dataset for one consumer."""

    urls: Sequence[str]
    settings: ReaderSettings
    manifest: ShardManifest
    cache: Callable[[], ShardCache]  # this process's cache of remote shards (made on first use)
    read: Callable[..., Iterator[dict]] = read_samples  # a spec collection's own (record fields=)
    locator: Locator | None = None  # the dataset's rewrite= / mirror= (None: the process's)

    def samples(self, plan: EpochPlan, errors: ErrorCount) -> Iterator[dict]:
        """Raw samples of one pass over the consumer's part (endless when resampled)."""
        if plan.assignment is None:  # resampled
            c = plan.consumer
            rng = rng_for(self.settings.seed, plan.epoch, c.rank, c.worker, TAG_RESAMPLE)
            for shard in resampled_shards(len(self.urls), self.manifest.counts, rng):
                yield from self.read_segment(Segment(shard), errors)
            return
        for segment in plan.assignment.segments:
            yield from self.read_segment(segment, errors)

    def open(self, index: int) -> Any:
        """A stream of shard `index`: straight from storage, or through the cache for remote shards."""
        url = self.urls[index]
        s = self.settings
        options = s.storage_options  # flat or per URL prefix: urls.open_read picks what applies
        if s.cache_dir is None or is_local(url) or url.startswith("pipe:") or url == "-":
            return open_read(url, options, allow_pipe=s.allow_pipe, locator=self.locator)
        m = self.manifest
        locator = self.locator
        return self.cache().open(
            url, lambda: open_read(url, options, allow_pipe=s.allow_pipe, locator=locator),
            # a cached copy is used only while the object open_read would read is still that version
            version=lambda: object_version(locator.resolve(url) if locator else resolve(url), options),
            nbytes=m.nbytes[index] if m.nbytes else None,
            sha256=m.sha256[index] if m.sha256 else None,
        )

    def read_segment(self, segment: Segment, errors: ErrorCount) -> Iterator[dict]:
        """The samples of `segment`; a shard read to its end is kept in the cache."""
        url = self.urls[segment.shard]
        stream = self.open(segment.shard)  # a shard that cannot be opened is always an error
        complete = False
        try:
            samples = self.read(stream, url, on_error=self.settings.on_error, report=errors.reported)
            try:
                stop = segment.stop
                counts = self.manifest.counts
                for i, sample in enumerate(samples):
                    if segment.take(i):
                        yield sample
                    if stop is not None and i + 1 >= stop:
                        # the range ends here; the shard is whole only if its last sample was read
                        complete = counts is not None and stop >= counts[segment.shard]
                        break
                else:
                    complete = True
            except ShardIOError:
                raise
            except ShardflowError as exc:  # damage that ends the shard (truncation, corrupt gzip)
                errors.handle(exc)
            finally:
                samples.close()
        finally:
            _finish(stream, complete, url)


def _finish(stream: Any, complete: bool, url: str) -> None:
    """Close a shard's stream; one read whole first reads the end of the archive (a cached copy
    checks it and keeps it)."""
    finish = getattr(stream, "finish", None)
    try:
        if complete and finish is not None:
            finish()
    except Exception as exc:  # noqa: BLE001 (the samples were fine; only the cache copy is lost)
        warn_once(f"shard {url}: not cached ({type(exc).__name__}: {exc})")
    finally:
        stream.close()
