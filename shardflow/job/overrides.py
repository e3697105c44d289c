"""`--set KEY=VALUE` overrides of a job file: parsed from the command line, applied to the job's
settings (JobSpec fields) or to the module's PARAMS (see job/jobfile.py for the rules)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from shardflow.errors import JobError
from shardflow.task.spec import JOB_FILE_KEYS, setting_default


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses as JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`["maxcount=100", "labels=[1, 2]"]` -> `{"maxcount": 100, "labels": [1, 2]}` (`--set` values).

    Values are JSON when they parse; the original text is remembered so a PARAMS key whose default
    is a string gets the text verbatim (`label_key=3` -> "3").
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise JobError(f"--set {item!r} is not KEY=VALUE")
        value = parse_value(text)
        out[key] = _Raw(value, text)
    return out


@dataclass(frozen=True)
class _Raw:
    """A parsed command-line value with the text it came from."""

    value: Any
    text: str


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    """Fit a value to the type of the default it replaces (when there is one and it is clear)."""
    raw = value if isinstance(value, _Raw) else None
    value = raw.value if raw is not None else value
    if default is None or value is None:
        return value
    if isinstance(default, str):
        if raw is not None:
            return raw.text
        if not isinstance(value, str):
            raise JobError(f"{where} {key!r} takes text, got {value!r}")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise JobError(f"{where} {key!r} takes true or false, got {value!r}")
        return value
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise JobError(f"{where} {key!r} takes a number, got {value!r}")
        if isinstance(default, float):
            return float(value)
        if isinstance(value, float):
            if not value.is_integer():
                raise JobError(f"{where} {key!r} takes an integer, got {value!r}")
            return int(value)  # 1e4 -> 10000
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise JobError(f"{where} {key!r} takes a list (JSON, e.g. [1, 2]), got {value!r}")
        return type(default)(value)
    if isinstance(default, dict) and not isinstance(value, dict):
        raise JobError(f"{where} {key!r} takes a dict (JSON, e.g. {{\"a\": 1}}), got {value!r}")
    return value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, _Raw) else value


def apply_overrides(path: Path, params: dict[str, Any] | None, settings: dict[str, Any],
                    overrides: Mapping[str, Any]) -> None:
    """Apply overrides to the job settings (JobSpec fields) and to the module's PARAMS, in place."""
    options = JOB_FILE_KEYS
    for full_key, value in overrides.items():
        key = full_key
        target = None
        if key.startswith("job."):
            target, key = "job", key[4:]
        elif key.startswith("params."):
            target, key = "params", key[7:]
        head, _, rest = key.partition(".")
        if target is None:
            if head in options:
                target = "job"
            elif params is not None and head in params:
                target = "params"
        if target == "job" and head in options:
            default = settings.get(head, setting_default(head))
            if rest:
                settings[head] = _set_nested(full_key, settings.get(head), rest, value)
            else:
                settings[head] = _coerce(full_key, value, default, "job option")
            continue
        if target == "params" and params is not None and head in params:
            if rest:
                params[head] = _set_nested(full_key, params[head], rest, value)
            else:
                params[head] = _coerce(full_key, value, params[head], "parameter")
            continue
        valid = f"job options: {', '.join(options)}"
        if params:
            valid += f"; PARAMS of {path.name}: {', '.join(params)}"
        else:
            valid += f"; {path.name} has no PARAMS"
        raise JobError(f"unknown setting {full_key!r} for job file {path}; valid keys are {valid}")


def _set_nested(full_key: str, current: Any, path: str, value: Any) -> dict[str, Any]:
    """`encode.png_compress_level=6`: a copy of the dict `current` with one entry (maybe deep) set."""
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise JobError(f"cannot set {full_key!r}: {full_key.split('.')[0]!r} is not a dict")
    out = dict(current)
    head, _, rest = path.partition(".")
    if rest:
        out[head] = _set_nested(full_key, out.get(head), rest, value)
    else:
        out[head] = _coerce(full_key, value, out.get(head), "setting") if head in out else _plain(value)
    return out
