"""What the shell tools (create, split, cat -o, head, sort, tsv, show, map) share: options and
terminal-safe text. The tools that run a job (split, cat -o, sort, map) run it through the one runner of
`shardflow run` (cli/running.py, tools/runner.py): the same flags, report, and exit status.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import click

from shardflow.cli.common import EXIT_ERROR, STORAGE_OPTION_HELP, Fail, parse_storage_options, setting_option
from shardflow.cli.running import backend_flags
from shardflow.errors import ON_ERROR
from shardflow.job.guard import inputs_at
from shardflow.storage import options as so
from shardflow.storage.specs import expand
from shardflow.text import escape
from shardflow.tools.runner import STDOUT, stdout_tar_problem


def printable(text: Any) -> str:
    """`text` safe to print on a terminal (shardflow.text.escape: controls, newlines, C1, lone surrogates of
    non-UTF-8 names escaped), so data can never move the cursor, retitle the window or fake lines."""
    return escape(str(text))


def storage_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--storage-option/-S KEY=VALUE` (the CLI convention: `-o` is always the output)."""
    return click.option("--storage-option", "-S", "storage_option", multiple=True, metavar="KEY=VALUE",
                        help=STORAGE_OPTION_HELP)(fn)


allow_pipe_option = setting_option("allow_pipe")

# the one --overwrite of the tools that write shards (what `shardflow run --overwrite` does: job.guard)
overwrite_option = click.option(
    "--overwrite", is_flag=True, help="replace existing shards under the output names that no run of this run "
    "directory wrote (other files beside the outputs never stop a run)")


def job_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of a tool that runs as a job: where it runs (backend_flags), its run directory, error
    policy, storage options and pipes; each job setting's help and default come from JobSpec."""
    options = [
        backend_flags,
        overwrite_option,
        setting_option("run_dir", metavar="URL"),
        setting_option("on_error", type=click.Choice(ON_ERROR)),
        storage_option,
        allow_pipe_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def job_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """ShardJob keywords from the shared options (run_dir, on_error, storage_options, allow_pipe)."""
    return dict(run_dir=kw["run_dir"], on_error=kw["on_error"], allow_pipe=kw["allow_pipe"],
                storage_options=parse_storage_options(kw["storage_option"]))


def progress_bar(enabled: bool | None, total: int | None, unit: str) -> Any:
    """A tqdm bar on stderr (default: when stderr is a terminal)."""
    import sys

    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=not (sys.stderr.isatty() if enabled is None else enabled),
                dynamic_ncols=True)


progress_option = click.option("--progress/--no-progress", default=None,
                               help="progress bar on stderr (default: on a terminal)")


def expand_all(specs: tuple[str, ...] | list[str], options: dict[str, Any] | None) -> list[str]:
    """Every shard URL the specs name, in order."""
    urls: list[str] = []
    for spec in specs:
        urls.extend(expand(spec, so.options_for(spec, options)))
    return urls


# ------------------------------------------------------------------------------------------------
# where a tool that writes one file (head, create, tsv, show, index, report) may write it


def refuse_input_as_output(output: str, inputs: Iterable[str]) -> None:
    """Exit 2 with one line, before anything is written, when `output` resolves to one of `inputs` (the
    job runner's rule and comparison: job.guard.input_at): writing it would destroy what is being read.
    Standard input/output (`-`) and pipes are streams, never files to compare."""
    if output == STDOUT or output.startswith("pipe:"):
        return
    found = inputs_at([output], (u for u in inputs if u != STDOUT and not u.startswith("pipe:"))).get(output)
    if found is not None:
        raise Fail(f"output {output} is the input {found}: writing it would destroy the input; write the output "
                   "somewhere else", EXIT_ERROR)


def refuse_tar_to_terminal(output: str) -> None:
    """Exit 2 with one line when a tar would go to standard output and that is a terminal
    (tools.runner.stdout_tar_problem: the one rule of `-o -`)."""
    problem = stdout_tar_problem(output)
    if problem:
        raise Fail(problem, EXIT_ERROR)


_KEPT = re.compile(r"(\n|\t)")


def terminal_bytes(data: bytes) -> bytes:
    """Member bytes as a terminal may show them: text kept, newlines and tabs kept, every other control,
    format or undecodable character escaped (shardflow.text.escape; bytes that are not UTF-8 as \\xNN), so a
    member cannot clear the screen, retitle the window or move the cursor."""
    text = data.decode("utf-8", errors="backslashreplace")
    return "".join(part if _KEPT.fullmatch(part) else escape(part) for part in _KEPT.split(text)).encode()
