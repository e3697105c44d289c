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
from contextlib import contextmanager
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
from shardflow.cli.tools_common import terminal_bytes
from shardflow.errors import DEFAULT_ON_ERROR_READ, ShardflowError
from shardflow.shards.keys import Sample
from shardflow.shards.records import iter_records, member_sizes, record_format, value_bytes
from shardflow.shards.samples import iter_samples, strays_once
from shardflow.shards.spec import SpecError, is_spec, load_spec
from shardflow.shards.tar_read import iter_members
from shardflow.storage import options as so
from shardflow.storage.counting import CountingReader
from shardflow.storage.schemes import open_read
from shardflow.storage.specs import expand
from shardflow.text import safe, safe_repr

_ALLOW_PIPE = setting_option("allow_pipe")


def register(group: click.Group) -> None:
    """Add `ls` to the `shardflow` command group (`stats`: cli/stats.py; `cat`: cli/tools_jobs.py)."""
    group.add_command(ls_command)


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
    report = None if warn is None else strays_once(warn)  # a shard's stray members: one warning, not one each
    return iter_samples(iter_members(stream, url, resync=resync), url, on_error=on_error, report=report)


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
        nsamples = nbytes = unreadable = 0
        for url in shards:
            if len(shards) > 1 and not as_json:
                out.write(f"# {safe(so.redact_urls(url), None)}\n")
            try:
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
            except (ShardflowError, OSError) as exc:  # skip: a shard that cannot be read to its end, as stats
                if on_error == "raise":
                    raise
                _warn(exc if isinstance(exc, ShardflowError) else ShardflowError(str(exc), url=url))
                unreadable += 1
        out.flush()
        bad = f" ({unreadable} unreadable, see the warnings above)" if unreadable else ""
        click.echo(f"{nsamples} samples, {nbytes} bytes of data ({_human(nbytes)}) in {len(shards)} shard(s){bad}",
                   err=True)


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
    written = sum(_cat_shard(url, keys, exts, allow_pipe, options) for url in urls)
    if exts and not written:  # as --key nope is: nothing printed because nothing matched is an error
        raise Fail(f"no member of any sample has extension {safe(', '.join(map(repr, exts)))}", EXIT_FAILED)


def _cat_shard(url: str, keys: tuple[str, ...], exts: tuple[str, ...], allow_pipe: bool,
               options: dict[str, Any] | None) -> int:
    """Print the chosen members of one shard; returns how many were printed."""
    out = sys.stdout.buffer
    shown = terminal_bytes if sys.stdout.isatty() else bytes  # a terminal obeys escapes in data; a pipe: exact
    wanted_exts = [e.lower().lstrip(".") for e in exts]
    written = 0
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
                    out.write(shown(value_bytes(sample[ext])))
                written += len(chosen)
                remaining.discard(key)
                if keys and not remaining:
                    break
        out.flush()
        if remaining:
            missing = ", ".join(safe_repr(k) for k in sorted(remaining))
            raise Fail(f"shard {safe(url)}: no sample with key {missing}", EXIT_FAILED)
    return written
