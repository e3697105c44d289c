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
rule that loops on one of its URLs.

A spec is untrusted input (a community spec, an include fetched over HTTP): `${VAR}` expands only in
the user's own top-level spec (a local file or a dict), never in an included or remote one unless the
name is in $SHARDFLOW_SPEC_VARS; includes are bounded (MAX_INCLUDE_DEPTH deep, MAX_INCLUDES in all),
numbers are bounded (weight, repeat, epoch), and a value shown in an error is a bounded repr, built
without walking a YAML alias bomb. webdataset's spellings map where they mean the same (spec_wds.py).

Readers (reader.mix) and jobs (job.shard_job) take the collections; this module only loads and checks
them and applies a collection's view (extensions, rename) to a sample.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import reprlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from shardflow.errors import ShardflowError
from shardflow.shards.keys import Sample
from shardflow.shards.spec_wds import NO_EQUAL, TOP_ALIASES, TOP_EXTRA, canonical
from shardflow.storage.locate import LocateError, current_locator
from shardflow.storage.paths import is_local, join, local_path
from shardflow.storage.specs import Variables, allowed_variables, expand

SPEC_SUFFIXES = (".yaml", ".yml", ".json")
TOP_FIELDS = ("dataset", "epoch")
COLLECTION_FIELDS = ("shards", "spec", "name", "weight", "repeat", "extensions", "rename", "fields")
MAX_INCLUDE_DEPTH = 16  # a spec including a spec including ... (a chain of remote includes ends here)
MAX_INCLUDES = 256  # spec files one load reads, the top one included
MAX_SPEC_BYTES = 16 << 20  # one spec file
MAX_WEIGHT = 1e9  # weights are proportions: sums and ratios of them must stay finite and exact enough
MAX_REPEAT = 1e6  # times a collection is seen per epoch
MAX_EPOCH = 10**12  # samples per epoch


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
        """`sample` with only the chosen entries, renamed (metadata `__*` always kept); the renames apply at
        once, as the (unordered) mapping says: `{a: b, b: a}` swaps; a rename into a present name replaces it."""
        if self.extensions is None and not self.rename:
            return sample
        keep = self.extensions
        out = {k: v for k, v in sample.items() if k.startswith("__") or keep is None or k in keep}
        out.update([(new, out.pop(old)) for old, new in self.rename if old in out])  # all popped, then set
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


@dataclass
class _Load:
    """One load_spec call: its storage options and what it has read so far (the include budget)."""

    storage_options: Any
    reads: int = 0
    untrusted: frozenset[str] = field(default_factory=allowed_variables)  # ${VAR} names includes may use


def load_spec(spec: str | Mapping[str, Any], storage_options: Any = None) -> DatasetSpec:
    """Load and check a dataset spec (a file name or URL, or the same structure as a dict).

    `${VAR}` expands in a dict and in a local top-level file (the user's own words); in a remote
    top-level spec and in every included spec only the names of $SHARDFLOW_SPEC_VARS do."""
    load = _Load(storage_options)
    if isinstance(spec, Mapping):
        return _build(dict(spec), "<dict>", None, load, (), True)
    return _build(_read(spec, load, None), spec, spec, load, (spec,), is_local(spec))


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


def _read(path: str, load: _Load, where: str | None) -> Any:
    import yaml

    from shardflow.storage.schemes import open_read

    at = f"{where}: " if where else ""
    load.reads += 1
    if load.reads > MAX_INCLUDES:
        raise SpecError(f"{at}more than {MAX_INCLUDES} spec files included in all; refusing to read {path}")
    try:
        with open_read(path, load.storage_options) as f:
            data = f.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise SpecError(f"{at}spec {path} is over {MAX_SPEC_BYTES >> 20} MiB")
        text = data.decode("utf-8")
    except (ShardflowError, OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, SpecError):
            raise
        cause = exc.reason if isinstance(exc, ShardflowError) else str(exc)
        raise SpecError(f"{at}cannot read spec {path}: {cause}") from None
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError(f"spec {path}: {exc}".replace("\n", " ")) from None
    except RecursionError:  # 20,000 nested `[`: the parser recurses per level
        raise SpecError(f"spec {path}: nested too deeply to be a dataset spec") from None


class _BoundedRepr(reprlib.Repr):
    """reprlib with dict subclasses (the loader's _Lined) treated as dicts, never as opaque objects
    (whose repr would walk all of them)."""

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, dict) and type(x) is not dict:
            return self.repr_dict(x, level)
        if isinstance(x, list) and type(x) is not list:
            return self.repr_list(x, level)
        return super().repr1(x, level)


_REPR = _BoundedRepr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 40, 40


def shown(value: Any, limit: int = 80) -> str:
    """A repr of data from a spec for a message, bounded before it is built: a 400-byte YAML alias
    bomb's full repr would be gigabytes (reprlib visits at most maxlist**maxlevel items)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _at(source: str, node: Any) -> str:
    line = getattr(node, "line", 0)
    return f"spec {source}, line {line}" if line else f"spec {source}"


def _unknown(where: str, name: str, valid: Sequence[str]) -> SpecError:
    close = difflib.get_close_matches(str(name)[:100], valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"
    return SpecError(f"{where}: unknown field {shown(name)}{hint}")


def _build(data: Any, source: str, path: str | None, load: _Load, stack: tuple[str, ...],
           trusted: bool) -> DatasetSpec:
    """A DatasetSpec from loaded data: a mapping with `dataset:` (or a bare list of collections).
    `trusted`: the user's own words, where any `${VAR}` expands."""
    if isinstance(data, list):
        data = {"dataset": data}
    if not isinstance(data, dict):
        raise SpecError(f"spec {source}: expected a mapping with 'dataset:', got {type(data).__name__}")
    for name in data:
        if name not in TOP_FIELDS + TOP_ALIASES + TOP_EXTRA:
            raise _unknown(_at(source, data), name, TOP_FIELDS)
    given = [n for n in ("dataset",) + TOP_ALIASES if n in data]
    if len(given) > 1:
        raise SpecError(f"{_at(source, data)}: 'datasets' is webdataset's name of 'dataset'; give one of them")
    entries = data[given[0]] if given else None
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{_at(source, data)}: 'dataset' must be a non-empty list of collections")
    epoch = data.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or not 1 <= epoch <= MAX_EPOCH):
        raise SpecError(f"{_at(source, data)}: epoch must be an integer from 1 to {MAX_EPOCH:.0e}, got {shown(epoch)}")
    prefix = _prefix(data, source)
    variables: Variables = True if trusted else load.untrusted
    collections: list[Collection] = []
    for entry in entries:
        collections.extend(_entry(entry, source, path, load, stack, variables, prefix))
    return DatasetSpec(source, tuple(collections), epoch)


def _prefix(data: dict, source: str) -> str:
    """webdataset's `prefix:` + `buckets:` (one bucket), put before every collection's shards."""
    prefix, buckets = data.get("prefix", ""), data.get("buckets", [""])
    buckets = [buckets] if isinstance(buckets, str) else buckets
    if not isinstance(prefix, str) or not isinstance(buckets, list) or len(buckets) != 1 \
            or not isinstance(buckets[0], str):
        raise SpecError(f"{_at(source, data)}: 'prefix' must be a string and 'buckets' one string (webdataset's "
                        f"spec); got {shown(prefix)}, {shown(buckets)}")
    return prefix + (buckets[0].rstrip("/") + "/" if buckets[0] else "")


def _entry(entry: Any, source: str, path: str | None, load: _Load, stack: tuple[str, ...],
           variables: Variables, prefix: str) -> list[Collection]:
    """The collections of one entry of `dataset:` (several for an include)."""
    if isinstance(entry, str):
        entry = _Lined(shards=entry)
    where = _at(source, entry)
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: a collection is a mapping with 'shards:' or 'spec:', got {shown(entry)}")
    entry = _canonical_fields(entry, where)
    if ("shards" in entry) == ("spec" in entry):
        raise SpecError(f"{where}: give exactly one of 'shards:' and 'spec:'")
    weight = _positive(entry.get("weight"), "weight", where, MAX_WEIGHT)
    if "spec" in entry:
        return _include(entry, weight, where, path, load, stack)
    shards = entry["shards"]
    urls = _urls(_prefixed(shards, prefix), where, load.storage_options, variables)
    written = shards if isinstance(shards, str) else shards[0]
    name = str(entry.get("name") or written)
    return [Collection(name, tuple(urls), weight, _repeat(entry.get("repeat"), where),
                       _names(entry.get("extensions"), "extensions", where), _rename(entry.get("rename"), where),
                       _names(entry.get("fields"), "fields", where), where)]


def _canonical_fields(entry: dict, where: str) -> dict:
    """`entry` with webdataset's spellings renamed to ours; an unknown field, or one with no equal
    here, is an error saying what to write."""
    out = _Lined()
    out.line = getattr(entry, "line", 0)
    for name, value in entry.items():
        if name in NO_EQUAL:
            raise SpecError(f"{where}: {NO_EQUAL[name]}")
        ours = canonical(name) if isinstance(name, str) else name
        if ours not in COLLECTION_FIELDS:
            raise _unknown(where, name, COLLECTION_FIELDS)
        if ours in out:
            raise SpecError(f"{where}: {name!r} is webdataset's name of {ours!r}; give one of them")
        out[ours] = value
    return out


def _prefixed(shards: Any, prefix: str) -> Any:
    if not prefix:
        return shards
    if isinstance(shards, str):
        return prefix + shards
    if isinstance(shards, list) and all(isinstance(s, str) for s in shards):
        return [prefix + s for s in shards]
    return shards


def _include(entry: dict, weight: float | None, where: str, path: str | None, load: _Load,
             stack: tuple[str, ...]) -> list[Collection]:
    """The collections of an included spec; its weights scaled so that they sum to `weight`."""
    for name in ("repeat", "extensions", "rename", "fields", "name"):
        if name in entry:
            raise SpecError(f"{where}: {name!r} applies to 'shards:' entries, not to an included 'spec:'")
    if not isinstance(entry["spec"], str) or not entry["spec"]:
        raise SpecError(f"{where}: 'spec' must be the name or URL of a spec file, got {shown(entry['spec'])}")
    target = entry["spec"]
    if path is not None and "://" not in target and not target.startswith("/"):
        target = _relative(path, target)
    if target in stack:
        raise SpecError(f"{where}: spec {target} includes itself ({' -> '.join(stack + (target,))})")
    if len(stack) >= MAX_INCLUDE_DEPTH:
        raise SpecError(f"{where}: includes nested deeper than {MAX_INCLUDE_DEPTH} ({stack[0]} -> ... -> {target})")
    inner = _build(_read(target, load, where), target, target, load, stack + (target,), False)
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


def _urls(shards: Any, where: str, storage_options: Any, variables: Variables) -> list[str]:
    if isinstance(shards, list) and all(isinstance(s, str) for s in shards) and shards:
        spec: str | list[str] = list(shards)
    elif isinstance(shards, str) and shards.strip():
        spec = shards
    else:
        raise SpecError(f"{where}: 'shards' must be a shard spec or a non-empty list of them, got {shown(shards)}")
    try:
        urls = expand(spec, storage_options, variables=variables)
        locator = current_locator()
        if locator.rules:
            for url in urls:
                locator.rewrite(url)  # a loop is found now, with the spec's line, not mid-epoch
    except (ShardflowError, LocateError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    return urls


def _positive(value: Any, name: str, where: str, limit: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"{where}: {name} must be a number > 0, got {shown(value)}")
    if not math.isfinite(value) or value > limit:
        raise SpecError(f"{where}: {name} must be at most {limit:g}, got {shown(value)}")
    return float(value)


def _repeat(value: Any, where: str) -> tuple[float, float]:
    if value is None:
        return (1.0, 1.0)
    if isinstance(value, list) and len(value) == 2:
        lo, hi = (_positive(v, "repeat", where, MAX_REPEAT) for v in value)
        if lo > hi:  # type: ignore[operator]
            raise SpecError(f"{where}: repeat range [{lo}, {hi}] has its low end above its high end")
        return lo, hi  # type: ignore[return-value]
    single = _positive(value, "repeat", where, MAX_REPEAT)
    return single, single  # type: ignore[return-value]


def _names(value: Any, name: str, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise SpecError(f"{where}: {name} must be a list of names (or one string of them), got {shown(value)}")
    return tuple(v.lower() if name == "extensions" else v for v in value)


def _rename(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SpecError(f"{where}: rename must be a mapping of entry names (old: new), got {shown(value)}")
    return tuple((str(k).lower(), str(v).lower()) for k, v in value.items())


def spec_json(spec: DatasetSpec) -> str:
    """A stable text of the collections (for fingerprints)."""
    return json.dumps([c.describe() for c in spec.collections] + [spec.epoch], sort_keys=True, default=str)
