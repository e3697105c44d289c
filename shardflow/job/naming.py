"""Output naming, in one place: which output URL (and rollover parts) each task writes.

`outputs` is either a spec naming one shard per task (matched by position), or a pattern with the
fields {task}, {name} (the input shard's basename without its tar suffix) and {part} (the rollover
part within a task). A fixed name that rolls over gets `_001`, `_002`... before its first dot.
Shard suffixes and what a name's compression means belong to shards.formats: a part-0 name shardflow
cannot write as it says (`.tar.lz4`; `.tar.zst` without the zstd extra) is refused here, at plan time.
"""

from __future__ import annotations

import functools
import posixpath
import re
import string
from typing import Any, Sequence

import braceexpand

from shardflow.errors import JobError
from shardflow.shards.formats import UnwritableName, check_output_name, shard_stem

__all__ = ["check_parts_apart", "check_writable", "first_output_folder", "is_pattern", "output_names", "pattern_name",
           "shard_stem"]

_FIELD = re.compile(r"\{(task|name|part)(?:[:!][^}]*)?\}")


def check_writable(name: str) -> None:
    """Refuse, as a one-line JobError, an output name shardflow cannot write as it says."""
    try:
        check_output_name(name)
    except UnwritableName as exc:
        raise JobError(str(exc)) from None


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
    for url in expanded:
        check_writable(url)
    return [(url, with_part_suffix(url)) for url in expanded]


def pattern_name(pattern: str, task_id: int, first_input: str) -> tuple[str, str]:
    """(URL of part 0, format string of the rollover parts) of one task of an output pattern.

    Input names come from whoever fills the bucket: a stem `.` or `..` (an input named `...tar`), or a
    filled name that leaves the folder the pattern's literal prefix names, is refused."""
    stem = "stdin" if first_input == "-" else shard_stem(first_input)  # `-` reads standard input
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
    check_writable(name)
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
    first: dict[str, int] = {}
    for task_id, (name, _) in enumerate(names):
        other = first.setdefault(name, task_id)
        if other != task_id:
            hint = (f"their inputs {groups[other][0]!r} and {groups[task_id][0]!r} share the name; add {{task}}"
                    if "{name" in pattern else "add {task} or {name}")
            raise JobError(f"output pattern {pattern!r} gives the same name {name!r} to tasks {other} and "
                           f"{task_id}: {hint}")
    return names


def check_parts_apart(names: Sequence[tuple[str, str]]) -> None:
    """Refuse names where a rollover part of one task is another task's output: each would replace the
    other's shard, and the samples in the one replaced are lost. It happens with plain names: re-splitting
    `a.tar` and `a_001.tar` (the parts of an earlier split) into `{name}.tar` gives task 0 the part
    `a_001.tar`. For jobs that roll over (maxcount/maxsize); O(tasks): a name is looked up by each run
    of digits in it, as the number of a part of the task whose part names frame that run.
    `names`: (URL of part 0, format string of the rollover parts) of each task, as output_names gives."""
    frames: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for task_id, (_, parts) in enumerate(names):
        frame = _part_frame(parts)
        if frame is not None:
            frames.setdefault(frame[:2], []).append((task_id, frame[2]))
    for task_id, (name, _) in enumerate(names):
        for digits in re.finditer(r"\d+", name):
            for other, spec in frames.get((name[: digits.start()], name[digits.end():]), ()):
                number = int(digits.group())
                if other != task_id and number >= 1 and format(number, spec) == digits.group():
                    raise JobError(f"rollover part {number} of task {other} (output {names[other][0]!r}) would "
                                   f"be {name!r}, the output of task {task_id}: one would replace the other and "
                                   "its samples would be lost; name the outputs apart (an explicit {part} field "
                                   "in the pattern, e.g. 'out/{name}-{part:03d}.tar')")


def _part_frame(parts: str) -> tuple[str, str, str] | None:
    """(literal text before the {part} field, literal text after it, its format spec) of a parts format
    string; None unless it has exactly one field, {part}."""
    pieces = list(string.Formatter().parse(parts))
    fields = [i for i, (_, field, _, _) in enumerate(pieces) if field is not None]
    if len(fields) != 1 or pieces[fields[0]][1] != "part" or pieces[fields[0]][3]:
        return None
    at = fields[0]
    before = "".join(text for text, _, _, _ in pieces[:at + 1])
    after = "".join(text for text, _, _, _ in pieces[at + 1:])
    return before, after, pieces[at][2] or ""
