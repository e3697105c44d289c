"""The sample key rule, in one place: which member names form one sample, and which keys can be
written so that they read back identically.

Key rule (webdataset's): the key is the member path up to the first dot of its basename, the
extension is the rest, lower-cased. `a.b/c/000123.seg.png` -> key `a.b/c/000123`, ext `seg.png`.
The tar reader uses it to name the sample an archive error hits, sample grouping to group members,
and the writer (through check_key and check_ext) to refuse names that would split differently when
read back. check_ext accepts every extension split_name gives (a `b..txt` member is key `b`,
extension `.txt`, and is written back as `b..txt`), so a sample the reader yields is never refused
by the writer for its extensions.
"""

from __future__ import annotations

from typing import Any

# A sample: "__key__" (str), "__url__" (the shard it came from), one entry per extension (bytes until
# decoded); keys starting with "__" are metadata and are never written into a tar.
Sample = dict[str, Any]


def split_name(name: str) -> tuple[str, str]:
    """Split a member path into (key, extension); extension is '' when the basename has no dot.

    This gives webdataset's split for every name webdataset gives a key to. A basename that starts
    with '.' (a hidden file) gives a key that is empty or ends with '/': iter_samples reports those.
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


def check_key(key: Any) -> str | None:
    """Why a sample key cannot be written so that it reads back identically (None when it can)."""
    if not isinstance(key, str) or not key:
        return f"sample key must be a non-empty str, got {key!r}"
    base = key[key.rfind("/") + 1 :]
    if not base:
        return f"sample key {key!r} ends with '/'"
    if "." in base:
        return f"sample key {key!r} has a '.' in its last path part, so it would split differently when read back"
    if key.startswith("/") or (".." in key and ".." in key.split("/")):  # split only when it can matter
        return f"sample key {key!r} is an absolute path or contains '..'"
    if "\0" in key:
        return f"sample key {key!r} contains a NUL character, which tar headers cannot hold"
    return None


def check_ext(ext: Any) -> str | None:
    """Why `ext` cannot be written as `key.ext` so that split_name gives it back (None when it can).

    The rule is split_name's, read backwards: a key has no '.' in its last path part, so the first
    '.' after it ends the key and everything after it is the extension, dots included (a leading
    '.' too: `b..txt` is key `b`, extension `.txt`). It must not hold '/' (the basename would
    change), must be lower-case (the reader lower-cases it) and must not be empty or hold NUL.
    """
    if not isinstance(ext, str) or not ext:
        return f"bad extension {ext!r}"
    if "/" in ext or "\0" in ext:
        return f"bad extension {ext!r}: it holds '/' or NUL"
    if ext != ext.lower():
        return f"extension {ext!r} is not lower-case: it would read back as {ext.lower()!r}"
    return None
