"""filter: keep the samples that pass simple, safe tests on their json metadata and image size.

Nothing is decoded except the json entry and the image header (Pillow reads the dimensions from
the first bytes of the file, without decoding pixels), and kept samples are copied byte for byte.
Each dropped sample is counted under its reason ("label not allowed", "width < min_width", ...) in
the report and in `shardflow status`.

There is no eval: conditions are data. `where` is a list of "FIELD OP VALUE" strings, all of which
must hold; FIELD is a json field (dotted for nested objects: `meta.source`), OP one of
== != < <= > >= in, not in, and VALUE a JSON literal (3, 0.5, "cc-by", [1, 2], true, null).
A missing field fails the test.

Run it:

    shardflow run filter --inputs 'data/train-{000000..000099}.tar' --outputs 'kept/{name}.tar' \\
        --set labels='[1, 2]' --set min_width=256 --set where='score >= 0.5'
    shardflow run filter ... --set where='["score >= 0.5", "meta.source != \\"web\\""]' --set require=jpg

PARAMS (all settable with --set):
    labels                 allowed values of json[label_key] (null: any)
    label_key              json field holding the label
    min_width, max_width   bounds on the image width in pixels (null: none)
    min_height, max_height bounds on the image height
    max_aspect             bound on long side / short side (null: none)
    require                extensions a sample must have: "jpg" or ["jpg", "json"]
    where                  a "FIELD OP VALUE" condition on the json, or a list of them
    image_key              entry holding the image (null: the first of jpg, jpeg, png, webp)
"""

import io
import json
import operator
import re

from PIL import Image

import shardflow as sf

JOB = dict(decode=None)  # raw bytes: only json and the image header are read, kept samples copied as is
PARAMS = dict(
    labels=None, label_key="label",
    min_width=None, max_width=None, min_height=None, max_height=None, max_aspect=None,
    require=None, where=None, image_key=None,
)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
_OPS = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
    "not in": lambda a, b: a not in b, "in": lambda a, b: a in b,
}
_CONDITION = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s+(==|!=|<=|>=|<|>|not\s+in|in)\s+(.+?)\s*$")
_parsed = {}


def parse_condition(text):
    """"score >= 0.5" -> (["score"], ">=", 0.5); raises ValueError naming the condition when malformed."""
    if text not in _parsed:
        match = _CONDITION.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"filter condition {text!r} is not 'FIELD OP VALUE' (OP: {', '.join(_OPS)})")
        field, op, value = match.groups()
        try:
            literal = json.loads(value)
        except ValueError:
            raise ValueError(f"filter condition {text!r}: {value!r} is not a JSON value "
                             "(quote strings: \"x\")") from None
        op = " ".join(op.split())
        if op in ("in", "not in") and not isinstance(literal, list):
            raise ValueError(f"filter condition {text!r}: '{op}' needs a JSON list, e.g. [1, 2]")
        _parsed[text] = (field.split("."), op, literal)
    return _parsed[text]


def lookup(meta, path):
    for part in path:
        if not isinstance(meta, dict) or part not in meta:
            return KeyError
        meta = meta[part]
    return meta


def image_size(data):
    """(width, height) from the image header, without decoding the pixels."""
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def _as_list(value):
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check(sample, params):
    """The reason to drop the sample, or None to keep it."""
    require, where = _as_list(params["require"]), _as_list(params["where"])
    for ext in require:
        if ext not in sample:
            return f"missing {ext}"
    meta = None
    if params["labels"] is not None or where:
        if "json" not in sample:
            return "missing json"
        meta = json.loads(sample["json"])
    if params["labels"] is not None:
        if lookup(meta, [params["label_key"]]) not in params["labels"]:
            return "label not allowed"
    for condition in where:
        path, op, literal = parse_condition(condition)
        value = lookup(meta, path)
        if value is KeyError:
            return f"where: no {'.'.join(path)}"
        if not _OPS[op](value, literal):
            return f"where: not {condition}"
    bounds = [params[k] for k in ("min_width", "max_width", "min_height", "max_height", "max_aspect")]
    if any(b is not None for b in bounds):
        key = params["image_key"] or next((k for k in IMAGE_KEYS if k in sample), None)
        if key is None or key not in sample:
            return "no image"
        width, height = image_size(sample[key])
        min_w, max_w, min_h, max_h, max_aspect = bounds
        if min_w is not None and width < min_w:
            return "width < min_width"
        if max_w is not None and width > max_w:
            return "width > max_width"
        if min_h is not None and height < min_h:
            return "height < min_height"
        if max_h is not None and height > max_h:
            return "height > max_height"
        if max_aspect is not None and max(width, height) > max_aspect * min(width, height):
            return "aspect > max_aspect"
    return None


def process(sample):
    reason = check(sample, PARAMS)
    if reason is not None:
        raise sf.SkipSample(reason)
    return sample
