"""webdataset's spellings in a dataset spec: what each one means here, or what to write instead.

webdataset's YAML specs (`MultiShardSample`'s `prefix`/`buckets`/`datasets`, the draft mixing spec's
`scaleprob`/`scale`, `construct_dataset`'s `probability`) are accepted where the meaning is the same;
a field whose meaning has no equal here is an error that says what to write instead. Data only:
shards/spec.py applies it.
"""

from __future__ import annotations

# top level: accepted as they are (spec.py reads them)
TOP_ALIASES = ("datasets",)  # webdataset's name of the `dataset:` list
TOP_EXTRA = ("prefix", "buckets")  # put before every collection's shards: prefix + bucket + "/" + shards

# a collection's field: webdataset's name -> ours (same meaning)
COLLECTION_ALIASES = {
    "scaleprob": "weight",  # the probability of drawing from this collection, relative to the others
    "probability": "weight",
    "scale": "repeat",  # how many times this collection's samples are seen per epoch
}

# a collection's field with no equal here -> what to write instead
NO_EQUAL = {
    "resample": "webdataset's 'resample' (N shards drawn with replacement per epoch) has no equal in a spec; "
                "write 'repeat:' (times each sample is seen per epoch) or use ShardDataset(resampled=True)",
    "choose": "webdataset's 'choose' (N of the shards per epoch) has no equal; write 'repeat:' below 1 "
              "(e.g. repeat: 0.25 for a quarter of the samples per epoch)",
    "perepoch": "webdataset's 'perepoch' has no equal; write 'repeat:' below 1 for a part of the collection "
                "per epoch, or the top-level 'epoch:' for samples per epoch",
}


def canonical(name: str) -> str:
    """Our name for a collection field written `name` (itself when it is not webdataset's)."""
    return COLLECTION_ALIASES.get(name, name)
