"""Output naming, in one place: which output URL (and rollover parts) each task writes.

`outputs` is either a spec naming one shard per task (matched by position), or a pattern with the
fields {task}, {name} (the input shard's basename without its tar suffix) and {part} (the rollover
part within a task). A fixed name that rolls over gets `_001`, `_002`... before its first dot.
"""

from __future__ import annotations

import functools
import posixpath
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


def first_output_folder(outputs: str | Sequence[str]) -> str | None:
    """The folder of the first task's output, from the outputs alone (no listing of the inputs, no plan):
    a pattern's literal folder, or the first name a spec expands to; None when a field is in the folder
    (`out/{task}/x.tar`: the plan says)."""
    if is_pattern(outputs):
        folder = outputs.rpartition("/")[0]  # type: ignore[union-attr]
        return None if "{" in folder or "}" in folder else folder or "."
    first = outputs if isinstance(outputs, str) else (outputs[0] if outputs else None)
    if not isinstance(first, str):
        return None
    return next(iter(braceexpand.braceexpand(first)), "").rpartition("/")[0] or "."


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
    """(URL of part 0, format string of the rollover parts) of one task of an output pattern.

    Input names come from whoever fills the bucket: a stem `.` or `..` (an input named `...tar`), or a
    filled name that leaves the folder the pattern's literal prefix names, is refused."""
    stem = shard_stem(first_input)
    if stem in (".", "..") and "{name" in pattern:
        raise JobError(f"input {first_input!r} of task {task_id} has the name {stem!r}, which as {{name}} in "
                       f"output pattern {pattern!r} would point outside the output folder; rename the input")
    filled = fill_pattern(pattern, {"task": task_id, "name": stem})
    if "{part" in filled:
        name, parts = filled.format(part=0), filled
    else:
        name = filled.replace("{{", "{").replace("}}", "}")
        parts = with_part_suffix(name)
    _check_inside(pattern, name, task_id, first_input)
    return name, parts


@functools.lru_cache(maxsize=64)
def _pattern_folder(pattern: str) -> tuple[str, str]:
    """(the folder of a pattern's literal prefix, as written; normalised without its scheme)."""
    literal = next(iter(string.Formatter().parse(pattern)), ("", None, None, None))[0]
    folder = literal.rpartition("/")[0]
    base = folder.partition("://")[2] if "://" in folder else folder
    return folder, posixpath.normpath(base) if base else "."


def _check_inside(pattern: str, name: str, task_id: int, first_input: str) -> None:
    """Refuse `name` unless it lies in the folder named by the literal text before the pattern's first field."""
    folder, root = _pattern_folder(pattern)
    inside = posixpath.normpath(name.partition("://")[2] if "://" in name else name)
    escapes = inside == ".." or inside.startswith("../") if root == "." else \
        not (inside + "/").startswith(root.rstrip("/") + "/")
    if escapes or (root == "." and inside.startswith("/")):
        raise JobError(f"output {name!r} of task {task_id} (from input {first_input!r}) resolves outside "
                       f"{(folder or '.')!r}, the folder of output pattern {pattern!r}; rename the input")


def _pattern_names(pattern: str, groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    names = [pattern_name(pattern, task_id, group[0]) for task_id, group in enumerate(groups)]
    if len({n for n, _ in names}) != len(names):
        raise JobError(f"output pattern {pattern!r} gives the same name to several tasks; add {{task}} or {{name}}")
    return names
