"""Built-in jobs shipped inside the package, so `shardflow run augment` works from a wheel.

The files here are byte-identical copies of the repository's `jobs/` (the source; edit those and
copy: `cp jobs/*.py shardflow/jobs_builtin/`; tests/jobs_builtin/test_ready_jobs.py fails when they drift). They are
job files, loaded by `shardflow.job.jobfile`, not modules to import.
"""
