"""`shardflow stats`: totals over whole specs (shards, samples, members, bytes, and per extension), each
shard streamed, `--jobs` at a time; a dataset spec's collections counted each and together.

Its own module beside `ls` and `cat` (cli/inspect.py), whose plumbing it shares: opening, reading with
the error policy, warnings, spec groups.
"""

from __future__ import annotations

import json
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import click

from shardflow.cli.common import parse_storage_options, spec_inputs, storage_option_flag
from shardflow.cli.inspect import _ALLOW_PIPE, _ON_ERROR, _errors, _groups, _human, _open, _samples, _warn
from shardflow.cli.locations import location_flags
from shardflow.errors import ShardflowError
from shardflow.shards.records import value_bytes
from shardflow.storage.locate import resolve
from shardflow.text import escape, safe


def register(group: click.Group) -> None:
    """Add `stats`."""
    group.add_command(stats_command)


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
