"""`python -m shardflow ...`: the same command as `shardflow ...` (for environments without the script)."""

from shardflow.cli import main

if __name__ == "__main__":
    main(prog_name="shardflow")
