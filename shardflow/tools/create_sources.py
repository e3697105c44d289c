"""What `shardflow create` may read, and reading it in bounded memory; a recipe's lines (plan_recipe).

A recipe is a list of file names written by someone, maybe a stranger (a recipe downloaded with a
dataset), and a directory tree can hold links planted by anyone who could write into it. Neither may
make create read what the person running it did not mean to pack:

- `SourceScope` says which sources a recipe may name without `--allow-outside`: `text:`, `pipe:`
  (only with `--allow-pipe`: it runs a command), local paths whose real path (links resolved) lies
  under the recipe's own folder (stdin's: the current directory), and URLs under the recipe's own
  remote folder. An absolute path elsewhere, `../x`, a link leading out, `/proc/self/environ` or
  `http://169.254.169.254/...` (a cloud metadata service) are refused before anything is read.
- every read is bounded by `max_bytes` (MAX_MEMBER_BYTES unless `--max-member-size`), and a local
  source must be a regular file: a FIFO or a device (`/dev/zero`) is refused with one line instead
  of hanging or reading until memory runs out. Files are opened O_NONBLOCK, so opening a FIFO never
  waits for a writer; the file type is checked (fstat) only when a read returns nothing or more than
  one read's worth, so the common tiny regular file costs no extra system call.
"""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Any, Iterable

from shardflow.errors import JobError, ShardIOError
from shardflow.storage import options as so
from shardflow.storage.paths import filesystem, is_local, local_path

MAX_MEMBER_BYTES = 1 << 32  # 4 GiB: a source larger than this is refused unless --max-member-size says more
READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
NOT_PATHS = ("text:", "pipe:")
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a link"}


def not_regular(mode: int) -> str | None:
    """Why a file of this st_mode cannot be packed (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_fd(fd: int, max_bytes: float) -> None:
    """Refuse a descriptor that is not a regular file, or one larger than `max_bytes`."""
    info = os.fstat(fd)
    why = not_regular(info.st_mode)
    if why:
        raise OSError(f"{why}, not a regular file; create packs regular files only")
    if info.st_size > max_bytes:
        raise OSError(f"{info.st_size} bytes, over the limit of {max_bytes:.0f} (--max-member-size)")


def read_fd(fd: int, max_bytes: float = MAX_MEMBER_BYTES) -> bytes:
    """All bytes of an open local file: two reads for a small regular file; the type and size are
    checked when the first read gives nothing (a FIFO reads empty) or there is more to read."""
    data = os.read(fd, 1 << 16)
    more = os.read(fd, 1 << 20) if data else b""
    return read_checked(fd, data, more, max_bytes) if more or not data else data


def read_checked(fd: int, first: bytes, second: bytes, max_bytes: float) -> bytes:
    """The rest of a file whose first two reads gave `first` and `second` (one of them empty or the
    second non-empty: an empty file, a FIFO, a device, or a big file), once fstat says it is a
    regular file within `max_bytes`; bounded by `max_bytes` while read too (a file that grows)."""
    check_fd(fd, max_bytes)
    if not second:
        return first
    chunks, total = [first, second], len(first) + len(second)
    while chunks[-1]:
        if total > max_bytes:
            raise OSError(f"more than {max_bytes:.0f} bytes (--max-member-size)")
        chunks.append(os.read(fd, 1 << 20))
        total += len(chunks[-1])
    return b"".join(chunks)


def read_local(path: str, max_bytes: float = MAX_MEMBER_BYTES) -> bytes:
    """A local file's bytes (plain os.open/os.read: for tiny files ~40 % cheaper than open().read())."""
    fd = os.open(path, READ_FLAGS)
    try:
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_source(source: str, storage_options: dict[str, Any] | None, max_bytes: float = MAX_MEMBER_BYTES,
                timeout: float = 600.0) -> bytes:
    """The bytes a plan source names: a local path, an fsspec URL, text:..., or pipe:CMD, at most
    `max_bytes` of them (more is an error naming the limit, never a MemoryError)."""
    try:
        if "://" not in source and not source.startswith(NOT_PATHS):  # a plain path, the common case
            return read_local(source, max_bytes)
        if source.startswith("text:"):
            return source[5:].replace("\\n", "\n").replace("\\t", "\t").encode("utf-8")
        if source.startswith("pipe:"):
            return _read_pipe(source[5:], max_bytes, timeout)
        if is_local(source):
            return read_local(local_path(source), max_bytes)
        fs, path = filesystem(source, so.options_for(source, storage_options))
        limit = int(min(max_bytes, 1 << 62)) + 1
        with fs.open(path, "rb") as stream:
            data = stream.read(limit)
        if len(data) > max_bytes:
            raise OSError(f"more than {max_bytes:.0f} bytes (--max-member-size)")
        return data
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ShardIOError(f"cannot read source {source!r}: {type(exc).__name__}: {exc}") from exc


def _read_pipe(command: str, max_bytes: float, timeout: float) -> bytes:
    """A command's stdout, at most `max_bytes` (the command is killed past it)."""
    with subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        data = proc.stdout.read(int(min(max_bytes, 1 << 62)) + 1)
        if len(data) > max_bytes:
            proc.kill()
            raise OSError(f"the command wrote more than {max_bytes:.0f} bytes (--max-member-size)")
        code = proc.wait(timeout)
    if code:
        raise subprocess.CalledProcessError(code, command)
    return data


class SourceScope:
    """Which sources a recipe may name: those under `base` (the recipe's folder: a local path or a
    URL prefix), text:, and pipe: with allow_pipe; anything with allow_outside."""

    def __init__(self, base: str, *, allow_pipe: bool = False, allow_outside: bool = False) -> None:
        self.allow_pipe = allow_pipe
        self.allow_outside = allow_outside
        self.local = "://" not in base or is_local(base)
        self.base = os.path.realpath(local_path(base) if "://" in base else base) if self.local else base.rstrip("/")

    @classmethod
    def of_recipe(cls, recipe: str, **flags: bool) -> "SourceScope":
        """The scope of a recipe at `recipe` ('-': stdin, whose folder is the current directory)."""
        if recipe == "-":
            return cls(os.getcwd(), **flags)
        folder = recipe.rsplit("/", 1)[0] if "/" in recipe.split("://", 1)[-1] else ""
        if "://" in recipe and not is_local(recipe):
            return cls(folder, **flags)
        return cls(os.path.dirname(os.path.abspath(local_path(recipe) if "://" in recipe else recipe)), **flags)

    def refusal(self, source: str) -> str | None:
        """Why `source` may not be read (None: it may)."""
        if source.startswith("text:"):
            return None
        if source.startswith("pipe:"):
            return None if self.allow_pipe else "pipe: sources run shell commands; pass --allow-pipe"
        if self.allow_outside:
            return None
        remote = "://" in source and not is_local(source)
        if remote:
            inside = (not self.local and source.startswith(self.base + "/")
                      and ".." not in source[len(self.base):].split("/"))
        else:
            path = os.path.realpath(local_path(source) if "://" in source else source)
            inside = self.local and (path == self.base or path.startswith(self.base.rstrip("/") + "/"))
        if inside:
            return None
        return (f"{source!r} is outside the recipe's folder ({self.base}); a recipe reads only files under "
                "its own folder unless you pass --allow-outside (docs/shell-tools.md: how far a recipe is trusted)")


class RecipePlan(list[tuple[str, str]]):
    """A recipe's (member name, source) pairs and the line each came from: the recipe is the one plan
    whose order is the user's, so a member refused for its place is named by its line."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.lines: list[int] = []

    def origin(self, index: int) -> str:
        return f"recipe {self.where}, line {self.lines[index]}"


def plan_recipe(lines: Iterable[str], where: str, allow_pipe: bool,
                scope: SourceScope | None = None) -> RecipePlan:
    """(member name, source) for each `name source` line; `#` comments and blank lines skipped.

    Each source is checked against `scope` (default: the recipe's folder): a recipe may be a
    stranger's, so what it may read is bounded before anything is read."""
    scope = scope or SourceScope.of_recipe(where, allow_pipe=allow_pipe)
    out = RecipePlan(where)
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\n")
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        parts = text.split("\t", 1) if "\t" in text else text.split(None, 1)
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise JobError(f"recipe {where}, line {number}: expected 'archive-name source', got {text!r}")
        name, source = parts[0].strip(), parts[1].strip()
        why = scope.refusal(source)
        if why:
            raise JobError(f"recipe {where}, line {number}: {why}")
        out.append((name, source))
        out.lines.append(number)
    return out


def check_max_bytes(value: float) -> float:
    if value < 1:
        raise JobError("--max-member-size must be at least 1 byte")
    return value
