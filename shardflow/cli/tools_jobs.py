"""`shardflow split`, `cat -o`, `sort` and `map -c CMD`: shard tools that run as jobs.

Each builds a ShardJob (byte-for-byte copies, a sorting stage, or a shell command per sample) and
runs it through the runner of `shardflow run` (cli/running.py, tools/runner.py): planned into a run
directory, resumable after a crash or Ctrl-C (rerun the same command), atomic per output shard, on any
backend, with run's report and exit status. This module owns `cat`: with -o it is a job, without it prints
members (cli/inspect.py's print_members).
"""

from __future__ import annotations

from typing import Any

import click

from shardflow.cli.common import setting_option, spec_inputs
from shardflow.cli.locations import location_flags
from shardflow.cli.numbers import finite
from shardflow.cli.running import run_job_command
from shardflow.cli.tools_common import expand_all, job_flags, job_kwargs
from shardflow.tools.sort import DEFAULT_MEMORY, SortSamples, passthrough

# job.shard_job (and numpy, through the seeds) is imported when a job is built, not for every `shardflow` command

_OUTPUT_PATTERN = click.option(
    "--output", "-o", "output", required=True, metavar="PATTERN",
    help="output shards: a pattern with {name} (input shard name), {task} and {part} (rollover part); a task "
         "with no sample to write (an empty input shard) writes none")
_MAXCOUNT = setting_option("maxcount", type=click.IntRange(min=1), metavar="N")
_MAXSIZE = setting_option("maxsize", metavar="BYTES")


def register(group: click.Group) -> None:
    """Add split, cat (-o: concatenate; without: print members), sort and map."""
    for command in (split_command, cat_command, sort_command, map_command):
        group.add_command(command)


@click.command("split")
@spec_inputs
@_OUTPUT_PATTERN
@_MAXCOUNT
@_MAXSIZE
@job_flags
def split_command(spec: tuple[str, ...], output: str, maxcount: int | None, maxsize: float | None,
                  **kw: Any) -> None:
    """Split shards into smaller ones (tarsplit): each input shard into parts of at most --maxcount
    samples and/or --maxsize bytes, samples copied byte for byte. Resumable; runs on any backend.
    An empty input shard gives no part: no empty shard is ever written.

    \b
      shardflow split 'data/train-{000..009}.tar' -o 'small/{name}-{part:04d}.tar' --maxsize 1e9
      shardflow split big.tar -o 'parts/big-{part:06d}.tar' --maxcount 1000
    """
    if maxcount is None and maxsize is None:
        raise click.UsageError("give --maxcount N and/or --maxsize BYTES")
    def make() -> Any:
        from shardflow.job.shard_job import ShardJob

        return ShardJob(passthrough, list(spec), output, maxcount=maxcount, maxsize=maxsize, name="split",
                        **job_kwargs(kw))

    run_job_command(make, kw)


@click.command("cat")
@location_flags
@spec_inputs
@click.option("--output", "-o", "output", metavar="OUT",
              help="concatenate every sample of SPEC... into OUT (a job: resumable, atomic) instead of printing")
@click.option("--key", "-k", "keys", multiple=True, help="without -o: only the sample with this key (repeatable)")
@click.option("--ext", "-e", "exts", multiple=True, help="without -o: only members with this extension (repeatable)")
@_MAXCOUNT
@_MAXSIZE
@job_flags
def cat_command(spec: tuple[str, ...], output: str | None, keys: tuple[str, ...], exts: tuple[str, ...],
                maxcount: int | None, maxsize: float | None, **kw: Any) -> None:
    """Print the bytes of members of a shard to stdout, or with -o concatenate shards into one.

    Without -o (as before): every member of every sample, in shard order, exactly as stored; --key
    picks samples (of one shard), --ext picks members. With -o OUT: the samples of all SPECs, in
    order, into the shard OUT (rolled over into OUT_001... by --maxcount/--maxsize), as one task of
    a resumable job (tarp cat).

    \b
      shardflow cat s3://b/train-000001.tar --key 000123 --ext jpg > 000123.jpg
      shardflow cat 'part-{000..099}.tar' -o all.tar
    """
    if output is None:
        from shardflow.cli.inspect import print_members

        print_members(spec, keys, exts, allow_pipe=kw["allow_pipe"], storage_option=kw["storage_option"])
        return
    if keys or exts:
        raise click.UsageError("--key/--ext select what to print; they do not apply with -o")

    def make() -> Any:
        from shardflow.job.shard_job import ShardJob

        urls = expand_all(spec, job_kwargs(kw)["storage_options"])
        if not urls:
            raise click.UsageError("SPEC names no shards")
        return ShardJob(passthrough, urls, output, maxcount=maxcount, maxsize=maxsize, inputs_per_task=len(urls),
                        name="cat", **job_kwargs(kw))

    run_job_command(make, kw)


@click.command("sort")
@spec_inputs
@_OUTPUT_PATTERN
@click.option("--by", default="key", show_default=True, metavar="key|FIELD",
              help="sort by the sample key, or a field: a member (cls) or a dotted path into JSON (json.label)")
@click.option("--reverse", is_flag=True, help="descending (samples without the field still go last)")
@click.option("--memory", type=finite(1), default=float(DEFAULT_MEMORY), show_default=True,
              help="bytes of samples held in memory; a larger shard is sorted in runs spilled to temp files")
@click.option("--tmpdir", type=click.Path(exists=True, file_okay=False),
              help="where spilled runs go (default: $TMPDIR)")
@job_flags
def sort_command(spec: tuple[str, ...], output: str, by: str, reverse: bool, memory: float, tmpdir: str | None,
                 **kw: Any) -> None:
    """Sort the samples within each shard (tarsort), stable, in bounded memory.

    Numbers (also numeric text such as cls) sort numerically, then text; samples without the field
    go last. Each input shard with samples becomes one output shard (a pattern with {name}); an empty
    one, or one whose samples all failed, gives none (no empty shard is ever written). Resumable.

    \b
      shardflow sort 'data/*.tar' -o 'sorted/{name}.tar' --by json.label
    """
    fn = SortSamples(by, memory=memory, reverse=reverse, tmpdir=tmpdir)
    params = {"sort_by": by, "reverse": reverse}
    def make() -> Any:
        from shardflow.job.shard_job import ShardJob

        return ShardJob(fn, list(spec), output, name="sort", params=params, **job_kwargs(kw))

    run_job_command(make, kw)


@click.command("map")
@spec_inputs
@_OUTPUT_PATTERN
@click.option("--command", "-c", required=True, metavar="CMD", help="sh -c CMD, run in each sample's directory")
@click.option("--parallel", "-p", type=click.IntRange(1, 256), default=1, show_default=True,
              help="samples of a task run at the same time (threads; each waits on its own command)")
@click.option("--timeout", type=finite(0, above=True), default=600.0, show_default=True,
              help="seconds per sample, then killed")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="add a variable to the clean environment")
@click.option("--pass-env", "pass_env", multiple=True, metavar="NAME", help="copy a variable from this environment")
@click.option("--tmpdir", type=click.Path(file_okay=False),
              help="where sample directories go [default: $TMPDIR, else /dev/shm with 1 GiB free, else /tmp]")
@_MAXCOUNT
@_MAXSIZE
@job_flags
def map_command(spec: tuple[str, ...], output: str, command: str, parallel: int, timeout: float,
                env: tuple[str, ...], pass_env: tuple[str, ...], tmpdir: str | None, maxcount: int | None,
                maxsize: float | None, **kw: Any) -> None:
    """Run a shell command on every sample (tarproc -c): members are written to a fresh private
    directory as <key-basename>.<ext>, CMD runs there (sh -c, no stdin, a timeout, a clean
    environment), and every file left in the directory becomes the output sample (deleted files
    dropped, new files added, the key kept). A failing command (non-zero exit, timeout) drops that
    sample and logs it, with the tail of its stderr, in the run directory (`shardflow status`). An input
    shard that gives no sample (empty, or every command failed) gives no output shard.

    \b
      shardflow map demo.tar -o 'small/{name}.tar' -p 4 -c 'convert *.jpg -resize 64x64 small.png && rm *.jpg'
      shardflow map 'data/*.tar' -o 'out/{name}.tar' -c 'gm mogrify -resize 256x256 *.jpg'
    """
    from shardflow.job.shell import ShellJob

    variables = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--env")
        variables[name] = value
    run_job_command(lambda: ShellJob(command, list(spec), output, parallel=parallel, timeout=timeout, env=variables,
                                     pass_env=pass_env, tmpdir=tmpdir, maxcount=maxcount, maxsize=maxsize,
                                     **job_kwargs(kw)), kw)
