"""`shardflow create` (shards from files: a directory tree or a recipe) and `shardflow head`.

Both run in this process (create reads with a thread pool; head stops after N samples), write
through ShardWriter/TarWriter (each shard atomic: nothing half-written under a final name) and are
deterministic, so rerunning an interrupted one rewrites identical shards.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from shardflow.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED,
    Fail,
    one_line_errors,
    parse_storage_options,
    setting_option,
    spec_inputs,
)
from shardflow.cli.numbers import finite
from shardflow.cli.tools_common import (
    allow_pipe_option,
    expand_all,
    printable,
    progress_bar,
    progress_option,
    refuse_input_as_output,
    refuse_tar_to_terminal,
    storage_option,
)
from shardflow.errors import JobError
from shardflow.shards.record_write import RecordWriter
from shardflow.shards.records import record_format
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.storage import options as so
from shardflow.storage.paths import is_local, local_path
from shardflow.storage.schemes import open_read
from shardflow.task.spec import MIN_MAXSIZE
from shardflow.tools.create_sources import MAX_MEMBER_BYTES
from shardflow.tools.output_temps import remove_dead_writers_temps, writer_tag
from shardflow.tools.runner import STDOUT


def register(group: click.Group) -> None:
    group.add_command(create_command)
    group.add_command(head_command)


_progress = progress_bar
_PROGRESS = progress_option


@click.command("create")
@click.argument("source")
@click.option("--output", "-o", "output", required=True, metavar="PATTERN",
              help="output shards: 'out/data-{part:06d}.tar' (or %06d); a fixed name when all fits in one")
@click.option("--recipe", is_flag=True, help="SOURCE is a recipe/TSV of 'archive-name source' lines "
              "(default when SOURCE is a file; '-' reads stdin)")
@setting_option("maxcount", type=click.IntRange(min=1), metavar="N", default=100_000, show_default=True)
@setting_option("maxsize", metavar="BYTES", default=3e9, show_default=True, type=finite(MIN_MAXSIZE))
@click.option("--shuffle", is_flag=True, help="permute the samples (deterministic for a --seed)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--keys", type=click.Choice(["from-path", "index"]), default="from-path", show_default=True,
              help="sample keys: the file paths (without extension), or 000000, 000001, ... in order")
@click.option("--jobs", "-j", type=click.IntRange(1, 512), default=None,
              help="reads in flight (threads) [default: 32 for remote sources; local files are read inline]")
@click.option("--dereference", is_flag=True, help="pack the files that links in a directory point to (as "
              "tar -h), when they lie inside the tree [default: links are skipped with a warning]")
@click.option("--allow-outside", is_flag=True, help="read sources outside the tree or the recipe's folder: links "
              "leading out of the tree (with --dereference), a recipe's absolute paths, ../ paths and URLs")
@click.option("--max-member-size", "max_member", metavar="BYTES", type=finite(1), default=float(MAX_MEMBER_BYTES),
              show_default=True, help="a source larger than this fails (bounded reads: a device or an endless "
              "pipe: source never fills memory)")
@_PROGRESS
@allow_pipe_option
@storage_option
def create_command(source: str, output: str, recipe: bool, maxcount: int, maxsize: float, shuffle: bool,
                   seed: int, keys: str, jobs: int | None, dereference: bool, allow_outside: bool, max_member: float,
                   progress: bool | None, allow_pipe: bool, storage_option: tuple[str, ...]) -> None:
    """Create shards from files (tarp create / tarcreate).

    SOURCE is a directory or a remote folder URL (files sharing a basename up to the first dot
    become one sample, members grouped by sample key (docs/shell-tools.md); hidden files skipped) or a recipe file
    (or '-'): one 'archive-name source' line per member, where source is a path or URL, text:...,
    or pipe:CMD (only with --allow-pipe). Links in a tree are skipped unless --dereference; a
    recipe reads only under its own folder unless --allow-outside (docs/shell-tools.md).

    \b
      shardflow create photos/ -o 'shards/photos-{part:06d}.tar' --maxcount 10000
      printf 'a/001.txt text:hello\\na/001.jpg s3://b/x.jpg\\n' | shardflow create - -o one.tar
    """
    from shardflow.tools.create import (
        group_samples,
        own_outputs,
        plan_directory,
        plan_recipe,
        plan_remote_tree,
        write_shards,
    )
    from shardflow.tools.create_sources import SourceScope

    options = parse_storage_options(storage_option)
    if max_member < 1:
        raise click.BadParameter("must be at least 1 byte", param_hint="--max-member-size")
    refuse_tar_to_terminal(output)
    with one_line_errors(options, catch=(JobError,)):
        if recipe or os.path.isfile(source) or source == "-":
            refuse_input_as_output(output, [source])  # the recipe itself
            scope = SourceScope.of_recipe(source, allow_pipe=allow_pipe, allow_outside=allow_outside)
            pairs = plan_recipe(_recipe_lines(source, options), source, allow_pipe, scope)
            named = own_outputs(pairs, output)
            if named:  # the recipe asks for it: refused, not left out
                raise Fail(f"recipe {printable(source)} names {printable(named[0])}, an output of this command, as "
                           "a source: packing it would replace it while it is read; write the output elsewhere",
                           EXIT_ERROR)
        else:
            if is_local(source):
                warnings = _Warnings()
                pairs = plan_directory(local_path(source), dereference=dereference, allow_outside=allow_outside,
                                       skipped=warnings)
                warnings.close()
            else:
                pairs = plan_remote_tree(source, options)
            pairs = _without_own_outputs(pairs, own_outputs(pairs, output))
        samples = group_samples(pairs, keys=keys, shuffle=shuffle, seed=seed)
    if not samples:
        raise Fail(f"{printable(source)} holds no files to pack")
    bar = _progress(progress, len(samples), "sample")
    try:
        with one_line_errors(options, exit_code=EXIT_FAILED):
            infos = write_shards(samples, output, maxcount=maxcount, maxsize=maxsize, storage_options=options,
                                 jobs=jobs, progress=bar.update, member_limit=max_member, temp_tag=writer_tag())
    finally:
        bar.close()
    _remove_killed_runs_temps([i.url for i in infos] if output != STDOUT else [])
    nbytes = sum(i.nbytes for i in infos)
    click.echo(f"{len(samples)} samples in {len(infos)} shard(s), {nbytes} bytes: "
               + ", ".join(printable(i.url) for i in infos[:3]) + (" ..." if len(infos) > 3 else ""),
               err=output == STDOUT)  # with -o -, stdout holds nothing but the tar


def _remove_killed_runs_temps(outputs: list[str]) -> None:
    """Delete the temps a killed earlier run (SIGKILL: no cleanup ran) left of these outputs, saying so:
    only those whose writer is provably dead (tools.output_temps)."""
    for temp in remove_dead_writers_temps(outputs):
        click.echo(f"shardflow: removed {printable(temp)}, left by a killed run", err=True)


def _without_own_outputs(pairs: list[tuple[str, str]], own: list[str]) -> list[tuple[str, str]]:
    """`pairs` without the shards this command writes (an earlier run's outputs inside the folder it packs,
    as GNU tar leaves out its own archive), saying so on stderr."""
    if not own:
        return pairs
    left_out = set(own)
    for source in own[:_Warnings.SHOWN]:
        click.echo(f"shardflow: warning: {printable(source)} left out: -o names it, so it is this "
                   "command's output (an earlier run's, or replaced now), not a source", err=True)
    if len(own) > _Warnings.SHOWN:
        click.echo(f"shardflow: warning: {len(own) - _Warnings.SHOWN} more outputs left out", err=True)
    return [pair for pair in pairs if pair[1] not in left_out]


class _Warnings:
    """Prints what the plan skipped, one line each up to a few, then how many more (a tree of 10,000
    links gives a dozen lines, not 10,000)."""

    SHOWN = 10

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, message: str) -> None:
        self.count += 1
        if self.count <= self.SHOWN:
            click.echo(f"shardflow: warning: {printable(message)}", err=True)

    def close(self) -> None:
        if self.count > self.SHOWN:
            click.echo(f"shardflow: warning: {self.count - self.SHOWN} more entries skipped (links or "
                       "files that are not regular)", err=True)


def _recipe_lines(source: str, options: dict[str, Any] | None) -> list[str]:
    if source == "-":
        return sys.stdin.read().splitlines()
    stream = open_read(source, so.options_for(source, options))
    try:
        return stream.read().decode("utf-8").splitlines()
    finally:
        stream.close()


@click.command("head")
@spec_inputs
@click.option("-n", "count", type=click.IntRange(min=0), default=10, show_default=True, help="samples to copy")
@click.option("--output", "-o", "output", required=True, metavar="OUT", help="the shard to write")
@_PROGRESS
@allow_pipe_option
@storage_option
def head_command(spec: tuple[str, ...], count: int, output: str, progress: bool | None, allow_pipe: bool,
                 storage_option: tuple[str, ...]) -> None:
    """Copy the first N samples of SPEC (in shard order) into one shard, byte for byte (tarscat -c N).

    Reads only as far as it needs; OUT appears only once complete. Fewer than N samples in SPEC is
    not an error (all of them are copied; stderr says so).

    \b
      shardflow head 's3://b/train-{000000..000099}.tar' -n 100 -o sample.tar
    """
    from shardflow.task.process import output_key_problem

    options = parse_storage_options(storage_option)
    refuse_tar_to_terminal(output)
    with one_line_errors(options):
        urls = expand_all(spec, options)
    refuse_input_as_output(output, urls)
    _remove_killed_runs_temps([output] if output != STDOUT else [])
    bar = _progress(progress, count, "sample")
    written, left_out = 0, 0
    produced_by: dict[str, str] = {}  # key -> the shard it came from: a key twice would not read back
    try:
        with one_line_errors(options, exit_code=EXIT_FAILED):
            # the name picks the format, as ShardWriter does: .cbors / .mps / .msgpacks are record streams
            kind = RecordWriter if record_format(output) else TarWriter
            with kind(output, storage_options=so.options_for(output, options), temp_tag=writer_tag()) as writer:
                for url in urls:
                    if written >= count:
                        break
                    for sample in read_samples(url, storage_options=so.options_for(url, options),
                                               allow_pipe=allow_pipe):
                        key = sample["__key__"]
                        problem = output_key_problem(key, key, produced_by, url=url)  # cat -o's check
                        if problem is not None:  # left out and said, as cat -o's default on_error does
                            left_out += 1
                            click.echo(f"shardflow: warning: {printable(problem)}; left out", err=True)
                            continue
                        produced_by[key] = f"{key} of {url}"
                        writer.write(sample)
                        written += 1
                        bar.update(1)
                        if written >= count:  # stop now: the next sample (maybe a bad one) is never read
                            break
    finally:
        bar.close()
    short = f" (SPEC holds only {written})" if written < count and not left_out else ""
    if left_out:  # said as what happened: the SPEC held more samples than were written
        short = (f"; {left_out} samples left out (duplicate or unwritable keys: see the warnings above)"
                 + ("; SPEC holds no more" if written < count else ""))
    click.echo(f"{written} samples written to {printable(output)}{short}", err=True)
