"""`shardflow ls`, `shardflow stats` and the printing of `shardflow cat`: look inside shards without
writing code. (`cat` itself is declared once, in cli/tools_jobs.py: with -o it runs a job, without it
calls `print_members` here.)

All three stream (one sample in memory at a time), work on any URL fsspec opens (local, s3://,
gs://, http(s)://, memory://; `-` is stdin), take `--storage-option KEY=VALUE` (repeatable, see
storage_options.parse_storage_option) and report a failure as one line on stderr with exit status 1,
never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator

import click

from shardflow.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    Fail,
    one_line_errors,
    parse_storage_options,
    setting_option,
    spec_inputs,
    storage_option_flag,
)
from shardflow.cli.locations import location_flags
from shardflow.errors import DEFAULT_ON_ERROR_READ, ShardflowError
from shardflow.shards.keys import Sample
from shardflow.shards.records import iter_records, member_sizes, record_format, value_bytes
from shardflow.shards.samples import iter_samples
from shardflow.shards.spec import SpecError, is_spec, load_spec
from shardflow.shards.tar_read import iter_members
from shardflow.storage import options as so
from shardflow.storage.counting import CountingReader
from shardflow.storage.locate import resolve
from shardflow.storage.schemes import open_read
from shardflow.storage.specs import expand
from shardflow.text import escape, safe, safe_repr

_ALLOW_PIPE = setting_option("allow_pipe")


def register(group: click.Group) -> None:
    """Add `ls` and `stats` to the `shardflow` command group (`cat`: cli/tools_jobs.py)."""
    group.add_command(ls_command)
    group.add_command(stats_command)


# ------------------------------------------------------------------------------------------------
# shared plumbing


@contextmanager
def _errors(options: dict[str, Any] | None) -> Iterator[None]:
    """Failures of ls/cat/stats: one line, exit status 1; a spec that cannot be parsed is a usage error (2,
    as for every command that cannot start); `| head` closing the pipe is not a failure."""
    with one_line_errors(options, exit_code=EXIT_FAILED, broken_pipe_ok=True):
        try:
            yield
        except SpecError as exc:
            raise Fail(so.scrub(str(exc), options), EXIT_ERROR) from None


def _expand(specs: tuple[str, ...], options: dict[str, Any]) -> list[str]:
    return [url for _, urls in _groups(specs, options) for url in urls]


def _groups(specs: tuple[str, ...], options: dict[str, Any]) -> list[tuple[str | None, list[str]]]:
    """(collection name or None, its shards) per spec: a dataset spec (train.yaml) gives one per collection."""
    out: list[tuple[str | None, list[str]]] = []
    for spec in specs:
        if is_spec(spec):
            out.extend((f"{c.name} ({c.where})", list(c.urls)) for c in load_spec(spec, options).collections)
        else:
            out.append((None, expand(spec, so.options_for(spec, options))))
    return out


@contextmanager
def _open(url: str, options: dict[str, Any], allow_pipe: bool) -> Iterator[CountingReader]:
    stream = open_read(url, so.options_for(url, options), allow_pipe=allow_pipe)
    try:
        yield CountingReader(stream)
    finally:
        stream.close()


def _samples(stream: BinaryIO, url: str, on_error: str, warn: Any = None) -> Iterator[Sample]:
    if record_format(url):  # .cbors / .mps / .msgpacks
        return iter_records(stream, url, on_error=on_error, report=warn)
    resync = on_error != "raise"
    return iter_samples(iter_members(stream, url, resync=resync), url, on_error=on_error, report=warn)


def _ls_line(key: str, sizes: dict[str, int], natives: dict[str, str] | None = None) -> str:
    """One `ls` line; key and extensions are data: escaped so that no name can forge a line or
    drive the terminal (--json keeps them exact, JSON escapes them). A record stream's native value
    (an int, a list) shows its type after the size of its text form: `cls:1(int)`."""
    natives = natives or {}
    return safe(key, None) + "\t" + " ".join(
        f"{safe(e, None)}:{n}" + (f"({natives[e]})" if e in natives else "") for e, n in sizes.items()) + "\n"


def _warn(error: ShardflowError) -> None:
    click.echo(f"shardflow: warning: {error}", err=True)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


_ON_ERROR = click.option(
    "--on-error", type=click.Choice(["raise", "skip"]), default=DEFAULT_ON_ERROR_READ, show_default=True,
    help="raise: stop at the first bad shard or sample; skip: warn on stderr and go on",
)


# ------------------------------------------------------------------------------------------------
# ls


@click.command("ls")
@spec_inputs
@click.option("--json", "as_json", is_flag=True, help="one JSON object per sample")
@_ON_ERROR
@_ALLOW_PIPE
@location_flags
@storage_option_flag()
def ls_command(spec: tuple[str, ...], as_json: bool, on_error: str, allow_pipe: bool,
               storage_option: tuple[str, ...]) -> None:
    """List the samples of shards: key, then extension:bytes of each member.

    SPEC is a shard URL, a brace pattern or a glob (several may be given). A summary line goes to
    stderr so that stdout stays one line per sample.
    """
    options = parse_storage_options(storage_option)
    out = sys.stdout
    with _errors(options):
        shards = _expand(spec, options)
        nsamples = nbytes = 0
        for url in shards:
            if len(shards) > 1 and not as_json:
                out.write(f"# {safe(so.redact_urls(url), None)}\n")
            with _open(url, options, allow_pipe) as stream:
                for sample in _samples(stream, url, on_error, _warn):  # type: ignore[arg-type]
                    sizes, natives = member_sizes(sample)
                    nsamples += 1
                    nbytes += sum(sizes.values())
                    if as_json:
                        record = {"shard": so.redact_urls(url), "key": sample["__key__"], "members": sizes}
                        if natives:
                            record["native"] = natives
                        out.write(json.dumps(record) + "\n")
                    else:
                        out.write(_ls_line(sample["__key__"], sizes, natives))
        out.flush()
        click.echo(f"{nsamples} samples, {nbytes} bytes of data ({_human(nbytes)}) in {len(shards)} shard(s)", err=True)


# ------------------------------------------------------------------------------------------------
# cat


def print_members(specs: tuple[str, ...], keys: tuple[str, ...], exts: tuple[str, ...], *, allow_pipe: bool,
                  storage_option: tuple[str, ...]) -> None:
    """`shardflow cat SPEC...` without -o: the bytes of members to stdout, exactly as stored, shard by shard.

    With --key, only that sample (an error if the shard does not have it; one shard only); with --ext,
    only members with that extension (an error if a chosen sample has none). Without either, every
    member of every sample, in shard order. Reading stops as soon as every --key was found.
    """
    options = parse_storage_options(storage_option)
    with _errors(options):
        urls = _expand(specs, options)
    if keys and len(urls) != 1:
        raise click.UsageError(f"--key looks in one shard; SPEC names {len(urls)}")
    for url in urls:
        _cat_shard(url, keys, exts, allow_pipe, options)


def _cat_shard(url: str, keys: tuple[str, ...], exts: tuple[str, ...], allow_pipe: bool,
               options: dict[str, Any] | None) -> None:
    out = sys.stdout.buffer
    wanted_exts = [e.lower().lstrip(".") for e in exts]
    with _errors(options):
        remaining = set(keys)
        with _open(url, options, allow_pipe) as stream:
            for sample in _samples(stream, url, "raise"):  # type: ignore[arg-type]
                key = sample["__key__"]
                if keys and key not in remaining:
                    continue
                present = [e for e in sample if not e.startswith("__")]
                chosen = [e for e in wanted_exts if e in sample] if wanted_exts else present
                if wanted_exts and not chosen and keys:
                    raise Fail(
                        f"shard {safe(url)}, key {safe_repr(key)}: no member with extension "
                        f"{', '.join(map(repr, wanted_exts))} (it has {safe(', '.join(present))})", EXIT_FAILED
                    )
                for ext in chosen:
                    out.write(value_bytes(sample[ext]))
                remaining.discard(key)
                if keys and not remaining:
                    break
        out.flush()
        if remaining:
            missing = ", ".join(safe_repr(k) for k in sorted(remaining))
            raise Fail(f"shard {safe(url)}: no sample with key {missing}", EXIT_FAILED)


# ------------------------------------------------------------------------------------------------
# stats


@dataclass
class _ExtStats:
    count: int = 0
    nbytes: int = 0
    smallest: int | None = None
    largest: int = 0

    def add(self, size: int) -> None:
        self.count += 1
        self.nbytes += size
        self.largest = max(self.largest, size)
        self.smallest = size if self.smallest is None else min(self.smallest, size)

    def merge(self, other: "_ExtStats") -> None:
        self.count += other.count
        self.nbytes += other.nbytes
        self.largest = max(self.largest, other.largest)
        if other.smallest is not None:
            self.smallest = other.smallest if self.smallest is None else min(self.smallest, other.smallest)


@dataclass
class _Stats:
    shards: int = 0
    bad_shards: int = 0
    samples: int = 0
    members: int = 0
    stored_bytes: int = 0  # as read from storage (compressed size for .tar.gz)
    data_bytes: int = 0  # member payloads
    problems: int = 0
    extensions: dict[str, _ExtStats] = field(default_factory=dict)

    def merge(self, other: "_Stats") -> None:
        for name in ("shards", "bad_shards", "samples", "members", "stored_bytes", "data_bytes", "problems"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for ext, st in other.extensions.items():
            self.extensions.setdefault(ext, _ExtStats()).merge(st)

    def to_json(self) -> dict[str, Any]:
        return {
            "shards": self.shards, "bad_shards": self.bad_shards, "samples": self.samples,
            "members": self.members, "stored_bytes": self.stored_bytes, "data_bytes": self.data_bytes,
            "problems": self.problems,
            "extensions": {
                ext: {"count": st.count, "bytes": st.nbytes, "min": st.smallest or 0, "max": st.largest}
                for ext, st in sorted(self.extensions.items())
            },
        }


def _shard_stats(url: str, options: dict[str, Any], allow_pipe: bool, on_error: str) -> _Stats:
    st = _Stats(shards=1)
    exts = st.extensions

    def problem(error: ShardflowError) -> None:
        st.problems += 1
        _warn(error)

    with _open(url, options, allow_pipe) as stream:
        for sample in _samples(stream, url, on_error, problem):  # type: ignore[arg-type]
            st.samples += 1
            for ext, value in sample.items():
                if ext.startswith("__"):
                    continue
                size = len(value_bytes(value))
                st.members += 1
                st.data_bytes += size
                e = exts.get(ext)
                if e is None:
                    e = exts[ext] = _ExtStats()
                e.add(size)
        st.stored_bytes = stream.nbytes
    return st


def _safe_shard_stats(url: str, options: dict[str, Any], allow_pipe: bool, on_error: str) -> _Stats:
    if on_error == "raise":
        return _shard_stats(url, options, allow_pipe, on_error)
    try:
        return _shard_stats(url, options, allow_pipe, on_error)
    except (ShardflowError, OSError) as exc:
        _warn(exc if isinstance(exc, ShardflowError) else ShardflowError(str(exc), url=url))  # type: ignore[arg-type]
        return _Stats(shards=1, bad_shards=1, problems=1)


@click.command("stats")
@spec_inputs
@click.option("--json", "as_json", is_flag=True, help="print the totals as one JSON object")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=4, show_default=True,
              help="shards read at the same time (threads; helps with object stores)")
@_ON_ERROR
@_ALLOW_PIPE
@click.option("--verbose", "-v", is_flag=True, help="list each shard and the URL really read for it (rewrite, mirror)")
@location_flags
@storage_option_flag()
def stats_command(spec: tuple[str, ...], as_json: bool, jobs: int, on_error: str, allow_pipe: bool, verbose: bool,
                  storage_option: tuple[str, ...]) -> None:
    """Totals over whole specs: shards, samples, members, bytes, and per extension count and sizes.

    Shards are streamed (never held whole), `--jobs` at a time. With --on-error skip, a bad shard
    or sample is reported on stderr and counted, and the totals cover the rest. A dataset spec
    (train.yaml) is reported per collection, then in total.
    """
    options = parse_storage_options(storage_option)
    with _errors(options):
        groups = _groups(spec, options)
        if verbose:
            for url in (u for _, urls in groups for u in urls):
                click.echo(f"{escape(url)} -> {escape(resolve(url))}")
        parts = [(name, _pool_stats(urls, options, allow_pipe, on_error, jobs)) for name, urls in groups]
        total = _Stats()
        for _, st in parts:
            total.merge(st)
        named = [(name, st) for name, st in parts if name is not None]
        if as_json:
            out = total.to_json()
            if named:
                out["collections"] = [{"name": name, **st.to_json()} for name, st in named]
            click.echo(json.dumps(out))
        else:
            for name, st in named:
                click.echo(f"collection {name}\n{_format_stats(st)}\n")
            click.echo(("total\n" if named else "") + _format_stats(total))


def _pool_stats(shards: list[str], options: dict[str, Any], allow_pipe: bool, on_error: str, jobs: int) -> _Stats:
    """Stats of `shards`, read `jobs` at a time."""
    total = _Stats()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        todo = deque(shards)
        running: set[Future[_Stats]] = set()
        try:
            while todo or running:
                while todo and len(running) < 2 * jobs:
                    running.add(pool.submit(_safe_shard_stats, todo.popleft(), options, allow_pipe, on_error))
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    total.merge(fut.result())
        except BaseException:
            for fut in running:
                fut.cancel()
            raise
    return total


def _format_stats(st: _Stats) -> str:
    lines = [
        f"shards        {st.shards}" + (f" ({st.bad_shards} unreadable)" if st.bad_shards else ""),
        f"samples       {st.samples}",
        f"members       {st.members}",
        f"stored bytes  {st.stored_bytes} ({_human(st.stored_bytes)})",
        f"data bytes    {st.data_bytes} ({_human(st.data_bytes)})",
    ]
    if st.problems:
        lines.append(f"problems      {st.problems} (see the warnings above)")
    if st.extensions:
        names = {ext: safe(ext, 40) for ext in st.extensions}  # extensions are data
        width = max(9, *(len(e) for e in names.values()))
        lines.append("")
        lines.append(f"{'extension':<{width}}  {'count':>10}  {'bytes':>14}  {'mean':>10}  {'min':>10}  {'max':>10}")
        for ext, e in sorted(st.extensions.items()):
            mean = e.nbytes / e.count if e.count else 0
            lines.append(
                f"{names[ext]:<{width}}  {e.count:>10}  {e.nbytes:>14}  {mean:>10.0f}  {e.smallest or 0:>10}  "
                f"{e.largest:>10}"
            )
    return "\n".join(lines)
