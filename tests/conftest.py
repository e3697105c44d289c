"""Shared pytest fixtures: REAL servers on 127.0.0.1, started once per session, nothing mocked.

Each server lives in its own plugin module under tests/support/, loaded here through ``pytest_plugins``:

- tests/support/s3.py: ``s3_server`` (session, SeaweedFS ``weed server -s3``) and ``s3_bucket`` (function).
- tests/support/gcs.py: ``gcs_server`` (session, fake-gcs-server) and ``gcs_bucket`` (function).
- tests/support/dask_cluster.py: ``dask_cluster`` (session, ``dask scheduler`` + two ``dask worker``
  processes) and ``dask_client`` (function).
- tests/support/slurm.py: ``slurm_cluster`` (session, munged + slurmctld + slurmd: one node, 2 CPUs).
- tests/support/ray_cluster.py: ``ray_cluster`` (session, ``ray start --head`` + a second node),
  ``ray_head`` (function) and ``ray_local`` (``ray.init(num_cpus=2)`` in this process).
- tests/support/processes.py: what they share (free ports, process groups, ``ServerStartError``).

See tests/README.md for the attributes. A fixture whose optional package is missing skips with the
reason; a server that fails to start raises ``ServerStartError`` with the tail of its log.

The markers (registered in pyproject.toml) are applied here from the fixtures a test uses:
``servers`` for the S3/GCS fixtures, ``cluster`` for the Dask ones. ``slow`` and ``gpu`` are written
on the tests themselves. ``make test-fast`` deselects all four.
"""

from __future__ import annotations

import os

import pytest

import tests.support.processes  # noqa: F401  (first: sets the s3fs/gcsfs/botocore environment)

# The processes backend runs tiny runs in the driver (backends/local.py `_in_driver`), and every test's
# data is tiny: the tests of workers (kills, interrupts, pinning, setup) keep their pool, here and in
# the `shardflow` subprocesses they start; tests/backends/test_local_start.py tests the choice itself.
os.environ.setdefault("SHARDFLOW_ALWAYS_POOL", "1")

pytest_plugins = ["tests.support.s3", "tests.support.gcs", "tests.support.dask_cluster", "tests.support.slurm",
                  "tests.support.ray_cluster", "tests.support.chromium"]

SERVER_FIXTURES = {"s3_server", "s3_bucket", "gcs_server", "gcs_bucket"}
CLUSTER_FIXTURES = {"dask_cluster", "dask_client", "slurm_cluster", "ray_cluster", "ray_head", "ray_local"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.servers)
        if used & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
