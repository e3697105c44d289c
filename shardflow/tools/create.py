"""Shards from files (`shardflow create`, tarp create / tarcreate): a plan of samples, read in parallel.

A plan is a list of (member name, source) pairs, grouped into samples by the key rule (files that
share a basename up to its first dot form one sample); a sample's members must be adjacent in it:

- from a directory tree (local or a remote folder): every regular file under it (hidden files skipped),
  in `sample_order`: `tar --sort=name`'s order, except that a sample's members are never split by a
  folder whose name starts like them (`a.jpg a.txt a.k/x.jpg`, where tar has `a.k/` in between); links
  are skipped with a warning, as GNU tar stores them as links (`dereference` follows those inside
  the tree, `allow_outside` the others too);
- from a recipe/TSV: lines `archive-name<TAB or spaces>source`, where source is a path or URL (any
  fsspec URL), `text:...` (the rest of the line, with \\n and \\t escapes) or `pipe:CMD` (only with
  allow_pipe: it runs a shell command). Paths and URLs outside the recipe's own folder need
  allow_outside, and every source is read bounded (create_sources: how far a recipe is trusted).
  Its order is the user's: a sample whose lines are not adjacent is refused, naming the line to move.

`--keys index` renames the samples `000000`, `000001`, ... in plan order; `--shuffle --seed S`
permutes the samples deterministically. Remote sources are read by a thread pool (`jobs` reads in
flight, results in plan order), so a million small files are not a million sequential round trips;
local files are read inline, a batch at a time. Shards are written by ShardWriter.write_batch
(rollover by maxcount/maxsize, each shard atomic).
"""

from __future__ import annotations

import gc
import os
import random
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, NamedTuple

from shardflow.errors import JobError, ShardIOError
from shardflow.job.guard import inputs_at
from shardflow.shards.keys import check_key, split_name
from shardflow.shards.writer import ShardInfo, ShardWriter
from shardflow.storage import options as so
from shardflow.storage.paths import filesystem, is_local
from shardflow.tools.create_sources import (
    MAX_MEMBER_BYTES,
    NOT_PATHS,
    READ_FLAGS,
    RecipePlan,
    not_regular,
    read_checked,
    read_source,
)
from shardflow.tools.create_sources import plan_recipe as plan_recipe  # the CLI's import: a plan's kinds here

_READ_FLAGS = READ_FLAGS


class PlannedSample(NamedTuple):
    """One output sample: its key and (extension, source) pairs in extension order (a tuple: a million
    of them are cheap)."""

    key: str
    members: tuple[tuple[str, str], ...]


def plan_directory(root: str, *, dereference: bool = False, allow_outside: bool = False,
                   skipped: Callable[[str], None] | None = None) -> list[tuple[str, str]]:
    """(member name relative to root, path) for every regular non-hidden file, in sample_order.

    One scandir per directory and no stat per file (the entry type comes with the listing). As GNU
    tar does not follow a link unless told (-h), a link is not followed: a sample cannot be filled from
    `/proc/self/environ` or `../secret` by whoever planted a link in the tree. It is skipped with a
    warning (`skipped(message)`; a tar member cannot be a link here); `dereference` packs the file a
    link points to when that lies inside the tree, and anywhere only with `allow_outside` too. Links
    to folders, FIFOs, devices and sockets are skipped with a warning (never a hang on a FIFO)."""
    if not os.path.isdir(root):
        raise JobError(f"{root!r} is not a directory")
    real_root = os.path.realpath(root).rstrip("/") + "/"
    found: list[tuple[str, str]] = []
    folders = [(root, "")]
    while folders:
        folder, prefix = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_file(follow_symlinks=False):  # files first: most entries are, one call each
                    found.append((prefix + entry.name, entry.path))
                elif entry.is_dir(follow_symlinks=False):  # like tar: never into a linked folder (no loops)
                    folders.append((entry.path, f"{prefix}{entry.name}/"))
                else:
                    why = _unpacked(entry, real_root, dereference, allow_outside)
                    if why is None:
                        found.append((prefix + entry.name, os.path.realpath(entry.path)))
                    elif skipped is not None:
                        skipped(f"skipped {prefix + entry.name!r}: {why}")
    return sample_order(found)


def _unpacked(entry: os.DirEntry[str], real_root: str, dereference: bool, allow_outside: bool) -> str | None:
    """Why a tree entry that is neither a regular file nor a folder is not packed (None: pack the file
    its link points to)."""
    if not entry.is_symlink():
        return f"{not_regular(entry.stat(follow_symlinks=False).st_mode)}, not a regular file"
    if not dereference:
        return "a symbolic link (pass --dereference to pack the file it points to)"
    target = os.path.realpath(entry.path)
    if not allow_outside and not target.startswith(real_root):
        return f"a link to {target!r}, outside the tree (pass --allow-outside to follow it)"
    try:
        why = not_regular(os.stat(target).st_mode)
    except OSError as exc:
        return f"a link to {target!r}, which cannot be read ({exc.strerror})"
    return f"a link to {target!r}, {why}" if why else None


def sample_order(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A tree's (member name, source) pairs in `tar --sort=name`'s order (a folder's entries by name,
    depth first, so `a/x` comes before `a.b/y`: a plain string sort puts '.' before '/'; NUL never
    occurs in a name), except that each sample's members follow its first one: tar's order puts
    `a.k/x.jpg` between `a.jpg` and `a.txt`, splitting sample `a`, and readers (webdataset's too) need
    a sample's members adjacent. Where tar keeps every sample whole, this is tar's order.

    Costs a split_name per file beyond tar's sort: +0.08 s for 100k files (0.04 -> 0.12 s)."""
    pairs = sorted(pairs, key=lambda item: item[0].replace("/", "\0"))
    rank: dict[str, int] = {}  # sample key -> its place: that of its first member in tar's order
    ranks = [rank.setdefault(split_name(name)[0], len(rank)) for name, _ in pairs]
    return [pairs[i] for i in sorted(range(len(pairs)), key=ranks.__getitem__)]  # stable: tar's order within


def plan_remote_tree(url: str, storage_options: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(member name, URL) for every object under a remote folder (one listing), in sample_order."""
    fs, root = filesystem(url, so.options_for(url, storage_options))
    root = root.rstrip("/")
    found = []
    for path in fs.find(root):
        rel = path[len(root) + 1 :] if path.startswith(root + "/") else path.rsplit("/", 1)[-1]
        if rel and not any(part.startswith(".") for part in rel.split("/")):
            found.append((rel, fs.unstrip_protocol(path)))
    if not found:
        raise JobError(f"{url!r} holds no files")
    return sample_order(found)


def group_samples(pairs: list[tuple[str, str]], *, keys: str = "from-path", shuffle: bool = False,
                  seed: int = 0) -> list[PlannedSample]:
    """Members -> samples (adjacent names sharing a key; a key seen again later is an error), each
    sample's members in extension order, as the writer orders them (so they go out as they are).

    One pass and one tuple per member, with the cyclic garbage collector paused: it would walk the
    growing plan again and again and never find a cycle in it (a third of the time for 100k files)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _group(pairs, keys, shuffle, seed)
    finally:
        if paused:
            gc.enable()


def _group(pairs: list[tuple[str, str]], keys: str, shuffle: bool, seed: int) -> list[PlannedSample]:
    samples: list[PlannedSample] = []
    current: list[tuple[str, str]] = []
    current_key = ""
    seen: dict[str, int] = {}  # key -> index of its sample's first member
    start = 0  # index in pairs of the current sample's first member
    for index, (name, source) in enumerate(pairs):
        key, ext = split_name(name)
        if key == current_key and current:
            current.append((ext, source))
            continue
        if current:
            samples.append(_planned(current_key, current, pairs, start))
        why = check_key(key)
        if why:
            raise JobError(f"member {name!r}: {why}")
        if key in seen:
            raise JobError(_split_sample(pairs, index, seen[key]))
        seen[key] = index
        current, current_key, start = [(ext, source)], key, index
    if current:
        samples.append(_planned(current_key, current, pairs, start))
    if shuffle:
        random.Random(seed).shuffle(samples)
    if keys == "index":
        samples = [_NEW(PlannedSample, (f"{i:06d}", s.members)) for i, s in enumerate(samples)]
    elif keys != "from-path":
        raise JobError(f"keys must be 'from-path' or 'index', not {keys!r}")
    return samples


_NEW = tuple.__new__  # a PlannedSample without the Python-level __new__ of a NamedTuple


def _split_sample(pairs: list[tuple[str, str]], index: int, first: int) -> str:
    """Why pairs[index] is refused: its sample began at pairs[first], other samples came between (a
    recipe's lines say where; a tree's plan is in sample_order and never meets this)."""
    name, key = pairs[index][0], split_name(pairs[index][0])[0]
    if isinstance(pairs, RecipePlan):
        began = pairs.lines[first]
        return (f"{pairs.origin(index)}: member {name!r}: sample {key!r} appears again after other samples (it "
                f"began on line {began}); a sample's lines must be adjacent: move this line next to line {began}")
    return (f"member {name!r}: sample {key!r} appears again after other samples (it began at member "
            f"{pairs[first][0]!r}); a sample's members must be adjacent in the plan")


def _planned(key: str, members: list[tuple[str, str]], pairs: list[tuple[str, str]], start: int) -> PlannedSample:
    """A sample with its (extension, source) pairs in extension order, each extension one the writer
    takes (the checks of shards.samples.sample_members, made here once, before anything is read);
    `pairs[start:]` begins with its members as planned, whose names the error messages give."""
    if len(members) > 1:
        members.sort()
    previous = None
    for ext, _ in members:
        if not ext or ext[0] == "." or "\0" in ext or ext == previous:
            names = [n for n, _ in pairs[start : start + len(members)] if split_name(n)[1] == ext]
            name = names[-1]  # of two with one extension: the later
            raise JobError(f"member {name!r}: " + (
                "no extension (a member needs <key>.<ext>)" if not ext
                else f"sample {key!r} already has a {ext!r} member" if ext == previous
                else f"bad extension {ext!r}"))
        previous = ext
    return _NEW(PlannedSample, (key, tuple(members)))


# a folder's descriptor only to open files relative to it: O_PATH (Linux) needs no read permission on
# the folder, just as opening a file by its whole path does not
_FOLDER_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def default_jobs(samples: list[PlannedSample]) -> int:
    """Reads in flight: many for remote sources (round trips); local files are read inline (0), by the
    writing thread itself.

    Measured on 100k tiny files in the page cache (writing, best of 15 on a loaded 2-core machine):
    inline 0.65 s wall / 0.65 s CPU, 1 read-ahead thread 0.67 / 0.66 (the thread only trades the
    GIL with the writer); more threads were slower still. `--jobs` sets threads for a cold or network disk."""
    return 32 if _remote(samples) else 0


def default_batch(samples: list[PlannedSample]) -> int:
    """Samples per read task: small for remote reads (spread over threads), large for local files
    (fewer hand-overs to the writer: 0.84 s against 0.97 s for 256 vs 32 with a read-ahead thread)."""
    return 32 if _remote(samples) else 256


def _remote(samples: list[PlannedSample]) -> bool:
    return any(not is_local(source) and not source.startswith(("text:", "pipe:"))
               for planned in samples[:100] for _, source in planned.members)


_INLINE_BYTES = 64 << 20  # an inline batch of big files ends once it holds this many bytes
Members = list[tuple[str, bytes]]  # one sample as the writer takes it: (key.ext, bytes), extensions sorted


def read_batch(chunk: list[PlannedSample], storage_options: dict[str, Any] | None,
               max_bytes: float = float("inf"), member_limit: float = MAX_MEMBER_BYTES) -> list[Members]:
    """The members of the planned samples in `chunk`, read: all of them, or the first ones up to and
    including the one that brings their bytes to `max_bytes` (so big files never pile up in memory).
    A source over `member_limit` bytes, or a local one that is not a regular file, fails its sample
    (create_sources: the file type is checked only when a read gives nothing or more than 64 KiB).

    Plain local paths (all of a directory plan) are read right here, read_local's reads written out
    (a call and a source dispatch per file were an eighth of the reading time for 100k tiny files),
    and from the second file in a row in one folder on, opened relative to that folder's descriptor:
    the kernel then walks one path component, not the whole path (another tenth)."""
    out = []
    op, rd, cl = os.open, os.read, os.close
    last, folder_fd = "", -1  # the folder of the previous plain path; its descriptor once opened
    total = 0
    try:
        for key, members in chunk:
            prefix = key + "."
            read = []
            for ext, source in members:
                try:
                    if "://" in source or source.startswith(NOT_PATHS):
                        data = read_source(source, storage_options, member_limit)
                    else:
                        folder, _, name = source.rpartition("/")
                        if folder and folder == last and name:
                            if folder_fd < 0:
                                folder_fd = op(folder, _FOLDER_FLAGS)
                            fd = op(name, _READ_FLAGS, dir_fd=folder_fd)
                        else:
                            if folder_fd >= 0:
                                cl(folder_fd)
                                folder_fd = -1
                            last = folder
                            fd = op(source, _READ_FLAGS)
                        try:
                            data = rd(fd, 1 << 16)
                            more = rd(fd, 1 << 20) if data else b""
                            if more or not data:  # big, empty, or not a regular file at all
                                data = read_checked(fd, data, more, member_limit)
                        finally:
                            cl(fd)
                except OSError as exc:
                    raise ShardIOError(f"member {ext!r}: cannot read source {source!r}: {type(exc).__name__}: "
                                       f"{exc}", key=key) from exc
                except ShardIOError as exc:
                    raise ShardIOError(f"member {ext!r}: {exc.reason}", key=key) from exc
                read.append((prefix + ext, data))
                total += len(data)
            out.append(read)
            if total >= max_bytes:
                break
    finally:
        if folder_fd >= 0:
            cl(folder_fd)
    return out


def read_batches(samples: list[PlannedSample], storage_options: dict[str, Any] | None,
                 jobs: int | None = None, batch: int = 32,
                 member_limit: float = MAX_MEMBER_BYTES) -> Iterator[list[Members]]:
    """The planned samples with their members read, in plan order, `batch` samples at a time: read
    by `jobs` threads, a bounded number of batches ahead (one future per batch keeps the pool's
    overhead small next to the read of a tiny file); `jobs=0` reads in the caller's thread, a batch
    at a time, cut short at 64 MiB."""

    def load(chunk: list[PlannedSample]) -> list[Members]:
        return read_batch(chunk, storage_options, member_limit=member_limit)

    jobs = default_jobs(samples) if jobs is None else jobs
    if not jobs:
        start = 0
        while start < len(samples):
            read = read_batch(samples[start : start + batch], storage_options, _INLINE_BYTES, member_limit)
            start += len(read)
            yield read
        return
    window = 2 * jobs
    with ThreadPoolExecutor(jobs, thread_name_prefix="shardflow-create") as pool:
        pending: deque[Future[list[Members]]] = deque()
        try:
            for start in range(0, len(samples), batch):
                pending.append(pool.submit(load, samples[start : start + batch]))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def own_outputs(pairs: list[tuple[str, str]], pattern: str) -> list[str]:
    """The sources of `pairs` that are shards this output `pattern` names (job.guard.inputs_at: the runner's
    comparison, links and `..` resolved), in plan order. An output inside the folder being packed is met
    as a source by the next run (`create t -o t/out.tar` twice): packed, it would put the dataset into
    itself, and then be replaced while read. A pattern names at most one shard per source."""
    if pattern == "-" or pattern.startswith("pipe:"):
        return []
    name = _shard_pattern(pattern)
    outputs = [name(index) for index in range(len(pairs) if "{" in pattern or "%" in pattern else 1)]
    hits = set(inputs_at(outputs, (source for _, source in pairs if not source.startswith(NOT_PATHS))).values())
    return [source for _, source in pairs if source in hits]


def write_shards(samples: list[PlannedSample], pattern: str, *, maxcount: int, maxsize: float,
                 storage_options: dict[str, Any] | None, jobs: int | None = None,
                 progress: Callable[[int], None] | None = None,
                 member_limit: float = MAX_MEMBER_BYTES, temp_tag: str = "") -> list[ShardInfo]:
    """Write the planned samples into shards named by `pattern` ({part} or %d: the shard index; `temp_tag`:
    the temps', see storage.atomic.temp_name).

    Whole batches of read samples go to ShardWriter.write_batch: their members are already bytes
    in the writer's order and checked when planned, so nothing per sample is done twice."""
    if "{" not in pattern and "%" not in pattern and len(samples) > maxcount:
        raise JobError(f"output {pattern!r} names one shard but {len(samples)} samples need more "
                       f"(--maxcount {maxcount}); give a pattern with {{part:06d}}")
    writer = ShardWriter(_shard_pattern(pattern), maxcount=maxcount, maxsize=maxsize,
                         storage_options=so.options_for(pattern, storage_options), temp_tag=temp_tag)
    with writer:
        for batch in read_batches(samples, storage_options, jobs, batch=default_batch(samples),
                                  member_limit=member_limit):
            writer.write_batch(batch)
            if progress is not None:
                progress(len(batch))
    return writer.shards


def _shard_pattern(pattern: str) -> Callable[[int], str]:
    """`out/x-{part:06d}.tar`, `out/x-%06d.tar` or a fixed name (one shard) -> index -> URL."""
    if "{" in pattern:
        try:  # a field create has no value for ({task}, {name} of the job tools): one line, before writing
            pattern.format(0, part=0, shard=0)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise JobError(f"output {pattern!r}: create cannot fill {exc} in it; its -o takes only {{part}} (or "
                           "{part:06d}, {shard}, {}, %06d): the shard's index") from None
        return lambda index: pattern.format(index, part=index, shard=index)
    if "%" in pattern:
        return lambda index: pattern % index

    def fixed(index: int) -> str:
        if index:
            raise JobError(f"output {pattern!r} names one shard but the samples need more; give a pattern "
                           "with {part:06d} or --maxcount/--maxsize large enough")
        return pattern

    return fixed
