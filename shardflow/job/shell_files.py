"""Samples <-> files of a private directory, for shell commands: names that data can never abuse.

A member `a/b/000123.seg.png` becomes the file `000123.seg.png` in the sample's own directory. Member
names come from the tar, so they are data: the file name is built from the key's basename and the
extension with every byte outside `[A-Za-z0-9_+,=@-]` (and `.` inside the extension) percent-encoded,
a leading `-` or `.` encoded too. The result is always one path component, printable ASCII, never an
option (`-rf`), never `..`, never hidden; `*.jpg` in the command matches what it should and nothing
else. Reading back decodes the extension (`%XX`), so an extension survives the round trip exactly;
the key is kept from the input (`__key__`), whatever the files are named.

Percent-encoding triples each UTF-8 byte, so a 60-character CJK key would need 540 bytes of file name
(most filesystems allow 255): a stem longer than MAX_STEM characters keeps its first part and ends in
`~` and a hash of the key (`~` is never in an encoded name, so the two forms never meet). The file is
named from the key only for the command's sake; the output's key is the input's.

Reading back opens the sample's directory with O_NOFOLLOW (a command that put a link in its place
reads nothing of the link's target) and each file relative to it with O_NOFOLLOW, then checks with
fstat that what was opened is a regular file within MAX_FILE_BYTES: what is read is what was checked.
A file of STREAM_FROM bytes or more is not read here: its open descriptor is the member's value
(storage.file_value.FileValue), which the shard writer copies in chunks, so a command that leaves a
600 MB file does not cost 600 MB of RAM. The descriptor keeps the data when the sample's directory is
removed (right after read-back), whichever thread writes the shard later.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Any

from shardflow.errors import SampleError
from shardflow.storage.file_value import FileValue

_SAFE_BASE = re.compile(rb"[A-Za-z0-9_+,=@-]")
_SAFE_EXT = re.compile(rb"[A-Za-z0-9_+,=@.-]")
MAX_FILE_BYTES = 1 << 32  # a file the command left that is larger than this fails the sample
STREAM_FROM = 4 << 20  # a file this large is handed on open (FileValue) and streamed, not read into RAM
MAX_STEM = 100  # characters of an encoded stem; longer ones are cut and end in ~<hash of the key>
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


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
    if not base:
        return "sample"
    encoded = _encode(base, _SAFE_BASE)
    if len(encoded) <= MAX_STEM:
        return encoded
    cut = MAX_STEM - 18
    while "%" in encoded[max(0, cut - 2) : cut]:  # never split a %XX escape
        cut -= 1
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{encoded[:cut]}~{digest}"


def member_file_name(key: str, ext: str) -> str:
    """`<key-basename>.<ext>`, both parts safe as one path component (see the module doc)."""
    ext_part = _encode(ext, _SAFE_EXT, lead=False)  # it follows `<base>.`: never leads the name
    if len(ext_part) > 250 - MAX_STEM:
        raise SampleError(f"extension {ext[:40]!r}... is too long to be a file name ({len(ext_part)} characters "
                          "encoded)", key=key)
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
            if isinstance(value, FileValue):  # a large file another command left: copied in chunks
                for piece in value.chunks():
                    f.write(piece)
            else:
                f.write(value)


def read_sample(directory: str, key: str, url: str) -> dict[str, Any]:
    """Every regular file of `directory` as a sample with `key`: the extension is what follows the
    first dot of the file name (`%XX` decoded). Hidden files are ignored; a file without an
    extension, two files with one extension, a directory or a link fail the sample (named)."""
    out: dict[str, Any] = {"__key__": key}
    origin: dict[str, str] = {}
    try:
        folder = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise SampleError(f"the command replaced its own directory ({exc.strerror}); nothing read back", url=url,
                          key=key) from None
    try:
        _read_files(folder, out, origin, url)
    finally:
        os.close(folder)
    return out


def _read_files(folder: int, out: dict[str, Any], origin: dict[str, str], url: str) -> None:
    key = out["__key__"]
    with os.scandir(folder) as entries:
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
            out[ext] = _read_file(folder, name, url, key)
            origin[ext] = name


def _read_file(folder: int, name: str, url: str, key: str) -> bytes | FileValue:
    """The bytes of the regular file `name` in `folder`, as opened (no link followed, type and size
    checked on the open descriptor, so a file swapped after the listing is refused, not read); from
    STREAM_FROM bytes on, the open descriptor itself (FileValue), which the shard writer streams."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=folder)
    except OSError as exc:  # ELOOP: a link put there after the listing
        raise SampleError(f"the command left {name!r}, which cannot be opened as a file ({exc.strerror})",
                          url=url, key=key) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SampleError(f"the command left {name!r}, which is not a regular file", url=url, key=key)
        if info.st_size > MAX_FILE_BYTES:
            raise SampleError(f"the command left {name!r}, larger than {MAX_FILE_BYTES} bytes", url=url, key=key)
        if info.st_size >= STREAM_FROM:  # handed on open: the writer copies it in chunks (FileValue)
            value, fd = FileValue(fd, info.st_size, name), -1
            return value
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()  # sized by fstat; every process of the command has been ended before this
    finally:
        if fd >= 0:
            os.close(fd)
