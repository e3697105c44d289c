"""Named fields of a raw sample, for sort, tsv and show: `key`, `url`, `cls`, `json.label`, `json.a.0.b`.

A field names a member by its extension (the longest one the sample has: `seg.json.x` tries
`seg.json` then `seg`), then optionally a dotted path into that member's JSON (dict keys, list
indices). Text members (cls, txt, ...) give their UTF-8 text stripped; json members their parsed
value; other members (images) their size in bytes. A field the sample lacks is None.
"""

from __future__ import annotations

import json
from typing import Any

TEXT_EXTENSIONS = ("cls", "cls2", "txt", "text", "label", "index", "id", "caption", "tsv", "csv")
_JSON_EXTENSIONS = ("json", "jsn")


class FieldError(ValueError):
    """A field path that cannot be followed in a sample (reason names the field)."""


def member_value(ext: str, data: Any) -> Any:
    """The value of a raw member for tables: parsed JSON, stripped text, or the byte count."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return data
    last = ext.rsplit(".", 1)[-1]
    if last in _JSON_EXTENSIONS:
        return json.loads(bytes(data))
    if last in TEXT_EXTENSIONS:
        return bytes(data).decode("utf-8", "replace").strip()
    return len(data)


def field_value(sample: dict[str, Any], field: str) -> Any:
    """The value `field` names in a raw sample (None when absent). Raises FieldError on a bad path."""
    if field in ("key", "__key__"):
        return sample.get("__key__")
    if field in ("url", "__url__"):
        return sample.get("__url__")
    parts = field.split(".")
    for i in range(len(parts), 0, -1):
        ext = ".".join(parts[:i])
        if ext in sample:
            try:
                value = member_value(ext, sample[ext])
            except ValueError as exc:
                raise FieldError(f"field {field!r}: member {ext!r} is not valid JSON: {exc}") from None
            return _walk(value, parts[i:], field)
    return None


def _walk(value: Any, path: list[str], field: str) -> Any:
    for step in path:
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and step.lstrip("-").isdigit():
            index = int(step)
            value = value[index] if -len(value) <= index < len(value) else None
        elif value is None:
            return None
        else:
            raise FieldError(f"field {field!r}: cannot look up {step!r} in a {type(value).__name__}")
    return value


def sort_key(value: Any) -> tuple[int, Any]:
    """A total order over field values: numbers (numerically), then text (a float NaN as "nan"), then
    others as JSON, then None."""
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, float) and value != value:
        # NaN compares false with everything, so a sort leaves it where it came, differently in memory and
        # in merged spilled runs: it sorts as the text "nan" (numeric text "nan" is text too, below)
        return (1, "nan")
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return (1, value)
        return (0, number) if number == number else (1, value)  # NaN has no place among numbers
    if value is None:
        return (3, "")
    return (2, json.dumps(value, sort_keys=True, default=repr))
