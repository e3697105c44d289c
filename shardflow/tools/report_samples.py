"""The before/after sheet of the report page: the first samples of one done task, as read and as written.

Like `shardflow show`: each sample's first image member thumbnailed, with its key and label (`cls`,
else `json.label`). The thumbnails are PNG data URIs (the page stays one file that needs no
network); keys and labels stay text, which the page escapes. A sample that cannot be read or drawn
is shown as such: the sheet never fails the report.
"""

from __future__ import annotations

import base64
import io
from itertools import islice
from typing import Any

from shardflow.codecs import IMAGE_EXTENSIONS
from shardflow.errors import ShardflowError
from shardflow.rundir.layout import done_file
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.samples import read_samples
from shardflow.text import safe
from shardflow.tools.fields import FieldError, field_value

THUMB = 128


def image_member(sample: dict[str, Any]) -> str | None:
    """The first image member (name order), as `show` picks it."""
    for ext in sorted(e for e in sample if not e.startswith("__")):
        if ext.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS:
            return ext
    return None


def label_of(sample: dict[str, Any]) -> str:
    for name in ("cls", "json.label"):
        try:
            value = field_value(sample, name)
        except (FieldError, ValueError):
            value = None
        if value is not None:
            return safe(value if isinstance(value, str) else str(value), 200)
    return ""


def thumbnail(data: bytes) -> str | None:
    """A PNG data URI of the image, at most THUMB pixels a side (None: not an image PIL reads)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            thumb = img.convert("RGB")
            thumb.thumbnail((THUMB, THUMB))
    except Exception:  # noqa: BLE001 - a sample that is not an image is shown without one
        return None
    out = io.BytesIO()
    thumb.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _tile(sample: dict[str, Any]) -> dict[str, Any]:
    ext = image_member(sample)
    return {"key": str(sample.get("__key__")), "label": label_of(sample), "member": ext,
            "image": thumbnail(sample[ext]) if ext else None}


def _first(url: str, count: int, options: dict[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
    try:
        return [_tile(s) for s in islice(read_samples(url, storage_options=options, on_error="skip"), count)], None
    except (ShardflowError, OSError) as exc:
        return [], f"{type(exc).__name__}: {safe(str(exc), 300)}"


def before_after(run_dir: RunDir, done_ids: list[int], count: int = 6,
                 storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The first `count` samples of the first done task's first input and first output shard, paired
    by key (a sample the job dropped has no "after")."""
    for task_id in done_ids[:3]:  # the first done task with an output shard
        try:
            marker = run_dir.read_json(done_file(task_id))
        except (FileNotFoundError, ValueError):
            continue
        if not marker.get("inputs") or not marker.get("outputs"):
            continue
        source, written = marker["inputs"][0], marker["outputs"][0]["url"]
        before, before_error = _first(source, count, storage_options)
        after, after_error = _first(written, count * 4, storage_options)
        by_key = {t["key"]: t for t in after}
        pairs = [{"before": b, "after": by_key.get(b["key"])} for b in before]
        return {"task": task_id, "input": source, "output": written, "pairs": pairs,
                "errors": [e for e in (before_error, after_error) if e]}
    return {"task": None, "pairs": [], "errors": []}
