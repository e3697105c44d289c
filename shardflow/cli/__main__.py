"""`python -m shardflow.cli`: the same as the `shardflow` command."""

from shardflow.cli import main

main()
