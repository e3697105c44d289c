"""Output naming, in one place: which output URL (and rollover parts) each task writes.

`outputs` is either a spec naming one shard per task (matched by position), or a pattern with the
fields {task}, {name} (the input shard's basename without its tar suffix) and {part} (the rollover
part within a task). A fixed name that rolls over gets `_001`, `_002`... before its first dot.
"""

from __future__ import annotations

import re
import string
from typing import Any, Sequence

import braceexpand

from shardflow.errors import JobError

_FIELD = re.compile(r"\{(task|name|part)(?:[:!][^}]*)?\}")
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar",  # read compressed (bz2, xz too)
                 ".cbors", ".msgpacks", ".mps")  # and record streams


def shard_stem(url: str) -> str:
    """Basename of a shard without its tar suffix: `s3://b/train-000003.tar.gz` -> `train-000003`."""
    base = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in _TAR_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def fill_pattern(pattern: str, values: dict[str, Any]) -> str:
    """Fill the named fields of an output pattern, keeping `{part...}` for the writer to fill."""
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(pattern):
        out.append(_escape(literal))
        if field is None:
            continue
        if field == "part":
            out.append("{part" + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
        elif field in values:
            out.append(_escape(format(values[field], spec or "")))
        else:
            raise JobError(f"output pattern {pattern!r} has unknown field {{{field}}}; "
                           "use {task}, {name}, {part}")
    return "".join(out)


def with_part_suffix(url: str) -> str:
    """Format string for rollover parts of a fixed output name: `x.tar` -> `x_{part:03d}.tar`."""
    head, slash, base = url.rpartition("/")
    stem, dot, rest = base.partition(".")
    return _escape(head + slash + stem) + "_{part:03d}" + _escape(dot + rest)


def is_pattern(outputs: str | Sequence[str]) -> bool:
    """Whether `outputs` is a pattern with {task}/{name}/{part} fields (else: a spec, one per task)."""
    return isinstance(outputs, str) and bool(_FIELD.search(outputs))


def output_names(outputs: str | Sequence[str], groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """(URL of part 0, format string of the rollover parts) for each task's input group."""
    if is_pattern(outputs):
        return _pattern_names(outputs, groups)  # type: ignore[arg-type]
    specs = [outputs] if isinstance(outputs, str) else list(outputs)
    expanded = [url for spec in specs for url in braceexpand.braceexpand(spec)]
    if len(expanded) != len(groups):
        raise JobError(
            f"outputs name {len(expanded)} shards but the inputs make {len(groups)} tasks; give one output "
            f"per task, or a pattern such as 'out/{{name}}.tar' or 'out/part-{{task:06d}}-{{part:03d}}.tar'"
        )
    if len(set(expanded)) != len(expanded):
        raise JobError("outputs name the same shard more than once")
    return [(url, with_part_suffix(url)) for url in expanded]


def pattern_name(pattern: str, task_id: int, first_input: str) -> tuple[str, str]:
    """(URL of part 0, format string of the rollover parts) of one task of an output pattern."""
    filled = fill_pattern(pattern, {"task": task_id, "name": shard_stem(first_input)})
    if "{part" in filled:
        return filled.format(part=0), filled
    unescaped = filled.replace("{{", "{").replace("}}", "}")
    return unescaped, with_part_suffix(unescaped)


def _pattern_names(pattern: str, groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    names = [pattern_name(pattern, task_id, group[0]) for task_id, group in enumerate(groups)]
    if len({n for n, _ in names}) != len(names):
        raise JobError(f"output pattern {pattern!r} gives the same name to several tasks; add {{task}} or {{name}}")
    return names
