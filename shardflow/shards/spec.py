"""Dataset specs: shard collections composed in proportions, from YAML, JSON or a dict.

    dataset:
      - shards: s3://ocr/ia1-{000000..000033}.tar
        weight: 0.3                 # mixing proportion
      - shards: gs://ocr/cdipsub-{000000..000022}.tar
        repeat: [1.0, 3.0]          # times seen per epoch (a range: drawn per epoch, seeded)
        extensions: nrm.jpg cls     # which entries to keep
        rename: {nrm.jpg: jpg}
      - spec: other-collection.yaml # included; relative paths resolve against this file
        weight: 0.2                 # the included collections share this weight
    epoch: 100000                   # samples per epoch, optional

Every problem is a SpecError naming the file and line: an unknown field (with the closest valid
one), a missing or circular include, a weight or repeat <= 0, a collection without shards, a rewrite
rule that loops on one of its URLs. Readers (reader.mix) and jobs (job.shard_job) take the collections;
this module only loads and checks them and applies a collection's view (extensions, rename) to a sample.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from shardflow.errors import ShardflowError
from shardflow.shards.keys import Sample
from shardflow.storage.locate import LocateError, current_locator
from shardflow.storage.paths import is_local, join, local_path
from shardflow.storage.specs import expand

SPEC_SUFFIXES = (".yaml", ".yml", ".json")
TOP_FIELDS = ("dataset", "epoch")
COLLECTION_FIELDS = ("shards", "spec", "name", "weight", "repeat", "extensions", "rename", "fields")


class SpecError(ShardflowError, ValueError):
    """A dataset spec that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Collection:
    """One shard collection of a spec, with how it is read and mixed."""

    name: str
    urls: tuple[str, ...]
    weight: float | None  # None: not given (mixing then follows repeat x sample counts)
    repeat: tuple[float, float]  # (low, high): a fixed factor when equal
    extensions: tuple[str, ...] | None  # entries kept (None: all)
    rename: tuple[tuple[str, str], ...]
    fields: tuple[str, ...] | None  # names of the entries of array items (record streams)
    where: str  # "file, line N" (for messages)

    def view(self, sample: Sample) -> Sample:
        """`sample` with only the chosen entries, renamed (metadata `__*` always kept)."""
        if self.extensions is None and not self.rename:
            return sample
        keep = self.extensions
        out = {k: v for k, v in sample.items() if k.startswith("__") or keep is None or k in keep}
        for old, new in self.rename:
            if old in out:
                out[new] = out.pop(old)
        return out

    def describe(self) -> dict[str, Any]:
        """What a state dict or a plan records of this collection."""
        return {"name": self.name, "shards": len(self.urls), "weight": self.weight, "repeat": list(self.repeat),
                "extensions": self.extensions, "rename": dict(self.rename), "fields": self.fields}


@dataclass(frozen=True)
class DatasetSpec:
    """The collections of a spec file (includes flattened, in order) and its epoch length."""

    source: str
    collections: tuple[Collection, ...]
    epoch: int | None

    @property
    def urls(self) -> list[str]:
        return [u for c in self.collections for u in c.urls]


def is_spec(spec: Any) -> bool:
    """Whether `spec` is a dataset spec (a dict, or a .yaml/.yml/.json name) rather than a shard spec."""
    if isinstance(spec, Mapping):
        return True
    return isinstance(spec, str) and spec.lower().split("?", 1)[0].endswith(SPEC_SUFFIXES)


def load_spec(spec: str | Mapping[str, Any], storage_options: Any = None) -> DatasetSpec:
    """Load and check a dataset spec (a file name or URL, or the same structure as a dict)."""
    if isinstance(spec, Mapping):
        return _build(dict(spec), "<dict>", None, storage_options, ())
    return _build(_read(spec, storage_options, None), spec, spec, storage_options, (spec,))


def _yaml_loader() -> type:
    """A yaml.SafeLoader whose mappings remember their line (JSON is read by it too)."""
    import yaml

    class LineLoader(yaml.SafeLoader):
        def construct_lined_map(self, node: Any) -> Any:
            mapping = _Lined()
            mapping.line = node.start_mark.line + 1
            yield mapping
            mapping.update(self.construct_mapping(node))

    LineLoader.add_constructor("tag:yaml.org,2002:map", LineLoader.construct_lined_map)
    return LineLoader


class _Lined(dict):
    line = 0


def _read(path: str, storage_options: Any, where: str | None) -> Any:
    import yaml

    from shardflow.storage.schemes import open_read

    try:
        with open_read(path, storage_options) as f:
            text = f.read().decode("utf-8")
    except (ShardflowError, OSError, UnicodeDecodeError) as exc:
        cause = exc.reason if isinstance(exc, ShardflowError) else str(exc)
        raise SpecError(f"{where + ': ' if where else ''}cannot read spec {path}: {cause}") from None
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError(f"spec {path}: {exc}".replace("\n", " ")) from None


def _at(source: str, node: Any) -> str:
    line = getattr(node, "line", 0)
    return f"spec {source}, line {line}" if line else f"spec {source}"


def _unknown(where: str, name: str, valid: Sequence[str]) -> SpecError:
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"
    return SpecError(f"{where}: unknown field {name!r}{hint}")


def _build(data: Any, source: str, path: str | None, storage_options: Any, stack: tuple[str, ...]) -> DatasetSpec:
    """A DatasetSpec from loaded data: a mapping with `dataset:` (or a bare list of collections)."""
    if isinstance(data, list):
        data = {"dataset": data}
    if not isinstance(data, dict):
        raise SpecError(f"spec {source}: expected a mapping with 'dataset:', got {type(data).__name__}")
    for name in data:
        if name not in TOP_FIELDS:
            raise _unknown(_at(source, data), name, TOP_FIELDS)
    entries = data.get("dataset")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{_at(source, data)}: 'dataset' must be a non-empty list of collections")
    epoch = data.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1):
        raise SpecError(f"{_at(source, data)}: epoch must be a positive integer, got {epoch!r}")
    collections: list[Collection] = []
    for entry in entries:
        collections.extend(_entry(entry, source, path, storage_options, stack))
    return DatasetSpec(source, tuple(collections), epoch)


def _entry(entry: Any, source: str, path: str | None, storage_options: Any,
           stack: tuple[str, ...]) -> list[Collection]:
    """The collections of one entry of `dataset:` (several for an include)."""
    if isinstance(entry, str):
        entry = _Lined(shards=entry)
    where = _at(source, entry)
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: a collection is a mapping with 'shards:' or 'spec:', got {entry!r:.80}")
    for name in entry:
        if name not in COLLECTION_FIELDS:
            raise _unknown(where, name, COLLECTION_FIELDS)
    if ("shards" in entry) == ("spec" in entry):
        raise SpecError(f"{where}: give exactly one of 'shards:' and 'spec:'")
    weight = _positive(entry.get("weight"), "weight", where)
    if "spec" in entry:
        return _include(entry, weight, where, path, storage_options, stack)
    urls = _urls(entry["shards"], where, storage_options)
    name = str(entry.get("name") or (entry["shards"] if isinstance(entry["shards"], str) else urls[0]))
    return [Collection(name, tuple(urls), weight, _repeat(entry.get("repeat"), where),
                       _names(entry.get("extensions"), "extensions", where), _rename(entry.get("rename"), where),
                       _names(entry.get("fields"), "fields", where), where)]


def _include(entry: dict, weight: float | None, where: str, path: str | None, storage_options: Any,
             stack: tuple[str, ...]) -> list[Collection]:
    """The collections of an included spec; its weights scaled so that they sum to `weight`."""
    for name in ("repeat", "extensions", "rename", "fields", "name"):
        if name in entry:
            raise SpecError(f"{where}: {name!r} applies to 'shards:' entries, not to an included 'spec:'")
    target = str(entry["spec"])
    if path is not None and "://" not in target and not target.startswith("/"):
        target = _relative(path, target)
    if target in stack:
        raise SpecError(f"{where}: spec {target} includes itself ({' -> '.join(stack + (target,))})")
    inner = _build(_read(target, storage_options, where), target, target, storage_options, stack + (target,))
    if inner.epoch is not None:
        raise SpecError(f"{where}: included spec {target} sets 'epoch', which only the top spec may set")
    parts = list(inner.collections)
    if weight is not None:
        given = [c.weight if c.weight is not None else 1.0 for c in parts]
        total = sum(given)
        parts = [_replace_weight(c, weight * g / total) for c, g in zip(parts, given)]
    return parts


def _replace_weight(c: Collection, weight: float) -> Collection:
    return replace(c, weight=weight)


def _relative(path: str, target: str) -> str:
    """`target` relative to the directory of the spec file `path`."""
    if is_local(path):
        return os.path.join(os.path.dirname(os.path.abspath(local_path(path))), target)
    return join(path.rsplit("/", 1)[0], target)


def _urls(shards: Any, where: str, storage_options: Any) -> list[str]:
    if isinstance(shards, list) and all(isinstance(s, str) for s in shards) and shards:
        spec: str | list[str] = list(shards)
    elif isinstance(shards, str) and shards.strip():
        spec = shards
    else:
        raise SpecError(f"{where}: 'shards' must be a shard spec or a non-empty list of them, got {shards!r:.80}")
    try:
        urls = expand(spec, storage_options)
        locator = current_locator()
        if locator.rules:
            for url in urls:
                locator.rewrite(url)  # a loop is found now, with the spec's line, not mid-epoch
    except (ShardflowError, LocateError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    return urls


def _positive(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"{where}: {name} must be a number > 0, got {value!r}")
    return float(value)


def _repeat(value: Any, where: str) -> tuple[float, float]:
    if value is None:
        return (1.0, 1.0)
    if isinstance(value, list) and len(value) == 2:
        lo, hi = (_positive(v, "repeat", where) for v in value)
        if lo > hi:  # type: ignore[operator]
            raise SpecError(f"{where}: repeat range [{lo}, {hi}] has its low end above its high end")
        return lo, hi  # type: ignore[return-value]
    single = _positive(value, "repeat", where)
    return single, single  # type: ignore[return-value]


def _names(value: Any, name: str, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise SpecError(f"{where}: {name} must be a list of names (or one string of them), got {value!r:.80}")
    return tuple(v.lower() if name == "extensions" else v for v in value)


def _rename(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SpecError(f"{where}: rename must be a mapping of entry names (old: new), got {value!r:.80}")
    return tuple((str(k).lower(), str(v).lower()) for k, v in value.items())


def spec_json(spec: DatasetSpec) -> str:
    """A stable text of the collections (for fingerprints)."""
    return json.dumps([c.describe() for c in spec.collections] + [spec.epoch], sort_keys=True, default=str)
