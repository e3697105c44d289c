"""`shardflow index SPEC`: the manifest of shards made elsewhere (sample counts, sizes, sha256), written
where the reader looks for it (reader/index.py does the work; this is argument parsing only)."""

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
    spec_inputs,
    storage_option_flag,
)
from shardflow.cli.locations import location_flags
from shardflow.cli.tools_common import refuse_input_as_output
from shardflow.errors import DEFAULT_ON_ERROR_READ, RAISE, SKIP
from shardflow.text import safe
from shardflow.tools.runner import STDOUT


def register(group: click.Group) -> None:
    """Add `index`."""
    group.add_command(index_command)


@click.command("index")
@spec_inputs
@click.option("--output", "-o", metavar="URL", default=None,
              help="write one manifest here (a summary.json URL or a folder) instead of beside the shards "
                   "(then pass it to ShardDataset(manifest=URL))")
@click.option("--processes", "-p", type=click.IntRange(1, 256), default=min(8, os.cpu_count() or 1),
              show_default=True, help="shards read at once (processes)")
@click.option("--on-error", type=click.Choice([RAISE, SKIP]), default=DEFAULT_ON_ERROR_READ, show_default=True,
              help="raise: a bad sample fails its shard; skip: count the samples a reader that skips bad ones "
                   "delivers (ShardDataset's default), one warning per shard")
@location_flags
@storage_option_flag()
def index_command(spec: tuple[str, ...], output: str | None, processes: int, on_error: str,
                  storage_option: tuple[str, ...]) -> None:
    """Index shards shardflow did not write: count each shard's samples, its size and sha256, and write
    the summary.json a job writes, where ShardDataset finds it (`_shardflow/summary.json` beside the first
    shard of the spec, or of each collection of a dataset spec). With it, ranks get equal sample counts
    (equalize=, len(), a mixed spec's quotas): needed to train on several ranks without a hang.

    Resumable: rerun the same command after a failure or Ctrl-C and only the shards not yet indexed are
    read. A damaged shard is reported (URL and reason) and the manifest is not written until every
    shard is indexed; with --on-error skip its bad samples are left out of the count, as the reader
    leaves them out. Members of no sample (no extension, hidden or macOS `._*` files) are never counted.

    \b
      shardflow index 'data/train-{000000..000099}.tar'
      shardflow index train.yaml -p 16
      shardflow index 's3://b/x-*.tar' -o s3://b/x-manifest.json
    """
    from shardflow.reader.index import run_index, targets
    from shardflow.shards.spec import SpecError

    if output == STDOUT:  # `-` is standard output for every command (tools.runner.STDOUT): no place for a manifest
        raise Fail("-o - (standard output): index writes a manifest that ShardDataset(manifest=URL) opens by URL; "
                   "give a summary.json URL or a folder", EXIT_ERROR)
    options = parse_storage_options(storage_option)
    with one_line_errors(options, exit_code=EXIT_FAILED):
        try:
            plan = targets(list(spec), options, output)
        except SpecError as exc:
            raise Fail(str(exc), EXIT_ERROR) from None
        if output is not None:  # -o may name a shard of the spec (or a folder: its summary.json)
            for target in plan:
                refuse_input_as_output(output, target.urls)
                refuse_input_as_output(target.manifest, target.urls)
        outcome = run_index(plan, options, processes=processes, progress=_progress(), on_error=on_error)
    _clear_progress()
    for url, count, first in outcome.left_out[:20]:  # what the reader leaves out too: one line per shard
        click.echo(f"shardflow: warning: {safe(url)}: {count} left out of the count, as the reader leaves them out "
                   f"(first: {safe(first, 1000)})", err=True)
    for url, reason in outcome.failed[:20]:
        click.echo(f"shardflow: FAILED {safe(url)}: {safe(reason, 1000)}", err=True)
    if len(outcome.failed) > 20:
        click.echo(f"shardflow: ... and {len(outcome.failed) - 20} more failed shards", err=True)
    shards = sum(len(t.urls) for t in plan)
    click.echo(f"indexed {outcome.indexed} shards ({outcome.resumed} from an earlier run), "
               f"{len(outcome.failed)} failed, of {shards}")
    for manifest in outcome.written:
        click.echo(f"wrote {safe(manifest)}")
    for manifest in outcome.counted_by_job:
        click.echo(f"kept {safe(manifest)}: the job that wrote these shards already counts them")
    if outcome.failed:
        raise Fail(f"{len(outcome.failed)} of {shards} shards could not be indexed; the manifest was not written "
                   f"({_advice(len(outcome.failed), len(outcome.bad_data), on_error)})", EXIT_FAILED)


def _advice(failed: int, bad_data: int, on_error: str) -> str:
    """What to do: bad data fails the same way on every rerun; I/O trouble may not."""
    fix = ("fix or remove those shards" if on_error == SKIP else
           "fix those shards, or count what the reader keeps with --on-error skip")
    if bad_data == failed:
        return f"the cause is in the data: {fix}"
    rerun = "rerun the same command to retry only those"
    return f"{bad_data} with bad data: {fix}; the others: {rerun}" if bad_data else rerun


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        if done == total or done % 50 == 0:
            click.echo(f"\rindexing: {done}/{total} shards", err=True, nl=False)

    return show


def _clear_progress() -> None:
    if sys.stderr.isatty():
        click.echo("", err=True)
