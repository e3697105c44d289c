"""Samples <-> files of a private directory, for shell commands: names that data can never abuse.

A member `a/b/000123.seg.png` becomes the file `000123.seg.png` in the sample's own directory. Member
names come from the tar, so they are data: the file name is built from the key's basename and the
extension with every byte outside `[A-Za-z0-9_+,=@-]` (and `.` inside the extension) percent-encoded,
a leading `-` or `.` encoded too. The result is always one path component, printable ASCII, never an
option (`-rf`), never `..`, never hidden; `*.jpg` in the command matches what it should and nothing
else. Reading back decodes the extension (`%XX`), so an extension survives the round trip exactly;
the key is kept from the input (`__key__`), whatever the files are named.
"""

from __future__ import annotations

import os
import re
from typing import Any

from shardflow.errors import SampleError

_SAFE_BASE = re.compile(rb"[A-Za-z0-9_+,=@-]")
_SAFE_EXT = re.compile(rb"[A-Za-z0-9_+,=@.-]")
MAX_FILE_BYTES = 1 << 32  # a file the command left that is larger than this fails the sample


def _encode(text: str, safe: re.Pattern[bytes], lead: bool = True) -> str:
    """Percent-encode every byte of `text` (UTF-8, surrogates as the raw bytes) that `safe` refuses."""
    raw = text.encode("utf-8", "surrogateescape")
    out = "".join(chr(b) if safe.fullmatch(bytes([b])) else f"%{b:02X}" for b in raw)
    if lead and out[:1] in ("-", "."):  # never an option, never hidden, never `.` or `..`
        out = f"%{ord(out[0]):02X}" + out[1:]
    return out


def _decode(text: str) -> str:
    """Inverse of _encode for names we wrote; other names pass through with `%XX` decoded."""
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


def file_base(key: str) -> str:
    """The file-name stem of a sample: its key's basename, made safe (never empty)."""
    base = key.rsplit("/", 1)[-1]
    return _encode(base, _SAFE_BASE) if base else "sample"


def member_file_name(key: str, ext: str) -> str:
    """`<key-basename>.<ext>`, both parts safe as one path component (see the module doc)."""
    ext_part = _encode(ext, _SAFE_EXT, lead=False)  # it follows `<base>.`: never leads the name
    return f"{file_base(key)}.{ext_part}"


def write_sample(directory: str, sample: dict[str, Any]) -> None:
    """Write each member of `sample` (bytes) into `directory`, created exclusively (O_EXCL, no follow)."""
    key = sample["__key__"]
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if isinstance(value, str):
            value = value.encode("utf-8")
        name = member_file_name(key, ext)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(os.path.join(directory, name), flags, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(value)


def read_sample(directory: str, key: str, url: str) -> dict[str, Any]:
    """Every regular file of `directory` as a sample with `key`: the extension is what follows the
    first dot of the file name (`%XX` decoded). Hidden files are ignored; a file without an
    extension, two files with one extension, a directory or a link fail the sample (named)."""
    out: dict[str, Any] = {"__key__": key}
    origin: dict[str, str] = {}
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            name = entry.name
            if name.startswith("."):
                continue
            if not entry.is_file(follow_symlinks=False):
                raise SampleError(f"the command left {name!r}, which is not a regular file (a directory or "
                                  "a link); only files become members", url=url, key=key)
            _, dot, ext = name.partition(".")
            ext = _decode(ext).lower()
            if not dot or not ext:
                raise SampleError(f"the command left {name!r}, a file without an extension; every file becomes "
                                  "a member named <key>.<extension>", url=url, key=key)
            if ext in out:
                raise SampleError(f"the command left {origin[ext]!r} and {name!r}: two files with the extension "
                                  f"{ext!r}; remove or rename one", url=url, key=key)
            if entry.stat(follow_symlinks=False).st_size > MAX_FILE_BYTES:
                raise SampleError(f"the command left {name!r}, larger than {MAX_FILE_BYTES} bytes", url=url, key=key)
            with open(entry.path, "rb") as f:
                out[ext] = f.read()
            origin[ext] = name
    return out
