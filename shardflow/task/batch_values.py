"""What a batched fn receives and returns: collated columns in, samples or columns out.

In:  a list of decoded samples, or with `collate=True` a dict of columns: a field whose values are
     arrays (or tensors) of one shape and dtype (and device) in every sample is stacked into one
     array (tensor) with the batch as first axis; any other field (keys, json, numbers, images of
     different sizes, a field some samples lack) is a list, None where a sample lacks it.
Out: a list (or generator) of sample dicts: fewer than the inputs filters, more is 1:N; or a dict
     of columns of one length (row i of each column makes output sample i); or None (all dropped).
     An output without `__key__` takes the key of the input at its position, which needs as many
     outputs as inputs.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Sequence

import numpy as np

from shardflow.codecs.tensors import is_tensor
from shardflow.errors import JobError
from shardflow.shards.keys import Sample


def collate(samples: Sequence[Sample]) -> dict[str, Any]:
    """Columns of a batch: same-shape arrays/tensors stacked, everything else a list."""
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(sample))
    return {name: _column([s.get(name) for s in samples]) for name in names}


def _column(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return np.stack(values)
    if is_tensor(first) and all(
        is_tensor(v) and v.shape == first.shape and v.dtype == first.dtype and v.device == first.device
        for v in values
    ):
        return sys.modules["torch"].stack(values)
    return values


def batch_outputs(result: Any, keys: Sequence[str]) -> list[tuple[Sample, int]]:
    """Normalise a batched fn's return value to [(output sample, index of the input it came from)].

    The input of an output is the one whose key it carries, else the one at its position (when as many
    outputs as inputs), else the one whose key starts the output's, else the first of the batch. It names
    the input in error messages and counts as `dropped` the inputs no output came from.
    """
    if result is None:
        return []
    if isinstance(result, dict):
        rows = _rows(result)
    elif isinstance(result, (list, tuple, types.GeneratorType)) or hasattr(result, "__next__"):
        rows = list(result)
    else:
        raise JobError(f"batched fn returned {type(result).__name__}; expected a list of dicts, a dict of "
                       "columns, or None")
    index = {key: i for i, key in enumerate(keys)}
    same_length = len(rows) == len(keys)
    out = []
    for position, row in enumerate(rows):
        if not isinstance(row, dict):
            raise JobError(f"batched fn returned a list holding {type(row).__name__}; expected dicts")
        if "__key__" not in row:
            if not same_length:
                raise JobError(f"batched fn returned {len(rows)} samples for {len(keys)} inputs without "
                               "__key__: give every output its __key__ when it filters or makes several")
            row = {**row, "__key__": keys[position]}
        key = row["__key__"]
        source = index.get(key) if isinstance(key, str) else None  # a bad key is refused per output later
        if source is None:
            source = _prefixed(key, keys) if not same_length else position
        out.append((row, source))
    return out


def _prefixed(key: Any, keys: Sequence[str]) -> int:
    """The input whose key starts the output's (`a/1` -> `a/1_0`, as 1:N outputs are named), else the first."""
    best = -1
    for i, candidate in enumerate(keys):
        if isinstance(key, str) and key.startswith(candidate) and (best < 0 or len(candidate) > len(keys[best])):
            best = i
    return max(best, 0)


def _rows(columns: dict[str, Any]) -> list[Sample]:
    """A dict of equal-length columns -> one dict per row (tensor rows copied: a view would carry, and
    torch.save would write, the whole batch's storage)."""
    lengths = {name: _length(name, value) for name, value in columns.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name}: {n}" for name, n in lengths.items())
        raise JobError(f"batched fn returned columns of different lengths ({shown})")
    count = next(iter(lengths.values()), 0)
    rows: list[Sample] = [{} for _ in range(count)]
    for name, value in columns.items():
        tensor = is_tensor(value)
        for i in range(count):
            rows[i][name] = value[i].clone() if tensor else value[i]
    return rows


def _length(name: str, value: Any) -> int:
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or not hasattr(value, "__getitem__"):
        raise JobError(f"batched fn returned column {name!r} as {type(value).__name__}; a column is a list, "
                       "an array or a tensor with one entry per output sample")
    return len(value)
