"""summary.json written as a stream: the same bytes `RunDir.write_json` gives, never whole in memory.

`json.dumps(redact_urls_deep(report), indent=1, sort_keys=True)` of a million-shard report builds
the shard dicts' copies, a million small strings and the ~150 MB text at once (1-2 GB). Here the
report's fields other than "shards" are encoded as before, and the shard entries are encoded one at
a time into chunks of about CHUNK bytes, with exactly json's indent=1 layout for a list nested one
level deep: readers (reader/manifest.py, status, `known_total`) see the file they always saw.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterable, Iterator

from shardflow.storage.options import redact_urls, redact_urls_deep

CHUNK = 1 << 16  # bytes handed to the writer at a time
_ENCODER = json.JSONEncoder(indent=1, sort_keys=True)
_ITEM_INDENT = "\n  "  # an entry of a list that is the value of a top-level key: two levels deep


_encode_str = json.encoder.encode_basestring_ascii  # json's own (C) string encoder, ensure_ascii as dumps


def encode_entry(entry: Any) -> str:
    """One shard entry, its URLs redacted, as json.dumps(redact_urls_deep(entry), indent=1,
    sort_keys=True) writes it two levels deep.

    Flat dicts of strings, integers, booleans and None (what shard entries are) take a short path
    (about 3x faster than json's pure-Python indenting encoder); anything else goes through json."""
    if type(entry) is dict and entry:
        items = []
        for key in sorted(entry):
            value = entry[key]
            kind = type(value)
            if type(key) is not str:
                break
            if kind is str:
                text = _encode_str(redact_urls(value))
            elif kind is int:
                text = int.__repr__(value)
            elif value is None:
                text = "null"
            elif kind is bool:
                text = "true" if value else "false"
            else:
                break
            items.append(f"   {_encode_str(key)}: {text}")
        else:
            return "{\n" + ",\n".join(items) + "\n  }"
    return _ENCODER.encode(redact_urls_deep(entry)).replace("\n", _ITEM_INDENT)


def summary_chunks(head: dict[str, Any], shards: Iterable[Any]) -> Iterator[bytes]:
    """The bytes of json.dumps(redact_urls_deep({**head, "shards": list(shards)}), indent=1,
    sort_keys=True), in chunks of about CHUNK bytes; `shards` is iterated once."""
    slot = f"\0shards-{uuid.uuid4().hex}"  # a value no report holds: where the list goes
    text = json.dumps(redact_urls_deep({**head, "shards": slot}), indent=1, sort_keys=True)
    before, after = text.split(json.dumps(slot), 1)
    pending, size = [before, "["], 0
    first = True
    for entry in shards:
        item = encode_entry(entry)
        pending.append(("\n  " if first else ",\n  ") + item)
        first = False
        size += len(item)
        if size >= CHUNK:
            yield "".join(pending).encode()
            pending, size = [], 0
    pending.append("]" if first else "\n ]")
    pending.append(after)
    yield "".join(pending).encode()
