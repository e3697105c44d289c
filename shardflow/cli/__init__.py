"""The `shardflow` command: one click group; each family of subcommands lives in its own module."""

from __future__ import annotations

import importlib

import click

# Modules that add commands to `main` when imported (each defines `register(group)`).
COMMAND_MODULES = (
    "shardflow.cli.inspect",  # ls, stats
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


for _name in COMMAND_MODULES:  # our own modules: an import error is a bug to see, never a missing command
    importlib.import_module(_name).register(main)


if __name__ == "__main__":
    main()
