"""A job's inputs: a shard spec, or a dataset spec (train.yaml, a dict) whose collections' shards
become the tasks. Weights, repeats and epoch lengths are for training and do not apply to jobs; a
collection's view (`extensions`, `rename`) does: it is applied to each sample of that collection's
shards before decoding, by the decoder the job builds once and pickles to its workers."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from shardflow.shards.keys import Sample
from shardflow.shards.spec import Collection, is_spec, load_spec
from shardflow.storage.specs import expand

Decode = Callable[[Sample], Sample]


def input_urls(inputs: Any, storage_options: Any) -> list[str]:
    """The input shards of a job, in order (a dataset spec: its collections', in spec order)."""
    if is_spec(inputs):
        return load_spec(inputs, storage_options).urls
    return expand(inputs, storage_options)


def input_views(inputs: Any, storage_options: Any) -> dict[str, Collection]:
    """url -> the collection whose view applies to that shard's samples (only those with one)."""
    if not is_spec(inputs):
        return {}
    views: dict[str, Collection] = {}
    for c in load_spec(inputs, storage_options).collections:
        if c.extensions is not None or c.rename:
            views.update((url, c) for url in c.urls)
    return views


def views_setting(views: Mapping[str, Collection]) -> list[Any] | None:
    """What the plan fingerprint records of the views (None when there are none)."""
    if not views:
        return None
    seen = {c.where: [c.extensions, dict(c.rename)] for c in views.values()}
    return [seen[k] for k in sorted(seen)]


class ViewingDecoder:
    """Applies a collection's view (by the sample's `__url__`), then the job's decoder (if any)."""

    def __init__(self, views: Mapping[str, Collection], inner: Decode | None) -> None:
        self.views = dict(views)
        self.inner = inner

    def raw_view(self, sample: Sample) -> Sample:
        """The raw sample as its collection's view shows it: the names the decoded sample has, each
        holding the raw bytes it is decoded from. task.process.unchanged_values reads it so that a
        value fn passes through is written as the bytes it came FROM (after `rename: {txt: json}`,
        the shard's `txt`), never as the shard's member that merely has the same name."""
        collection = self.views.get(sample.get("__url__", ""))
        return collection.view(sample) if collection is not None else sample

    def __call__(self, sample: Sample) -> Sample:
        sample = self.raw_view(sample)
        return self.inner(sample) if self.inner is not None else sample


def job_decoder(inputs: Any, storage_options: Any, inner: Decode | None) -> Decode | None:
    """The decoder a job runs: `inner`, wrapped by the views of a dataset spec's collections."""
    views = input_views(inputs, storage_options)
    return ViewingDecoder(views, inner) if views else inner


__all__ = ["ViewingDecoder", "input_urls", "input_views", "job_decoder", "views_setting"]
