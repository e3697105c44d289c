"""The `shardflow` command: one click group; each family of subcommands lives in its own module."""

from __future__ import annotations

import importlib
import warnings

import click

from shardflow.errors import ShardflowWarning
from shardflow.text import safe

# Modules that add commands to `main` when imported (each defines `register(group)`).
COMMAND_MODULES = (
    "shardflow.cli.inspect",  # ls
    "shardflow.cli.stats",  # stats
    "shardflow.cli.jobs",  # run, plan, status, demo
    "shardflow.cli.cluster",  # worker, k8s, argo
    "shardflow.cli.slurm",  # slurm
    "shardflow.cli.trying",  # preview
    "shardflow.cli.tools_jobs",  # split, cat (-o: concatenate; without: print members), sort, map
    "shardflow.cli.tools_make",  # create, head
    "shardflow.cli.tools_view",  # tsv, show
    "shardflow.cli.indexing",  # index (the manifest of shards made elsewhere)
    "shardflow.cli.report",  # report
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shardflow")
def main() -> None:
    """Transform WebDataset tar shards: resumable, atomic, on processes, Dask or Kubernetes."""
    warnings.formatwarning = _format_warning


# -- warnings on the terminal: ShardflowWarning as one line, its text escaped -------------------------
_PYTHON_FORMAT = warnings.formatwarning


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """`shardflow: warning: <message>` for a ShardflowWarning (data in it escaped by text.safe, no source
    line: it says what happened to a shard, not where in shardflow); other warnings as Python shows them.
    Only the command sets it: a library user's warnings stay Python's own (their text built escaped)."""
    if issubclass(category, ShardflowWarning):
        return f"shardflow: warning: {safe(str(message), 2000)}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


for _name in COMMAND_MODULES:  # our own modules: an import error is a bug to see, never a missing command
    importlib.import_module(_name).register(main)


if __name__ == "__main__":
    main()
