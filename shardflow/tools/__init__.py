"""End-user tools above the job and the reader: shell-facing sort, fields, create, preview, demo and
the one CLI runner every command that runs a job uses."""
