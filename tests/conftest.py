"""Shared pytest fixtures: REAL servers on 127.0.0.1, started once per session, nothing mocked.

Each server lives in its own plugin module under tests/support/, loaded here through ``pytest_plugins``:

- tests/support/s3.py: ``s3_server`` (session, SeaweedFS ``weed server -s3``) and ``s3_bucket`` (function).
- tests/support/gcs.py: ``gcs_server`` (session, fake-gcs-server) and ``gcs_bucket`` (function).
- tests/support/dask_cluster.py: ``dask_cluster`` (session, ``dask scheduler`` + two ``dask worker``
  processes) and ``dask_client`` (function).
- tests/support/processes.py: what they share (free ports, process groups, ``ServerStartError``).

See tests/README.md for the attributes. A fixture whose optional package is missing skips with the
reason; a server that fails to start raises ``ServerStartError`` with the tail of its log.

The markers (registered in pyproject.toml) are applied here from the fixtures a test uses:
``servers`` for the S3/GCS fixtures, ``cluster`` for the Dask ones. ``slow`` and ``gpu`` are written
on the tests themselves. ``make test-fast`` deselects all four.
"""

from __future__ import annotations

import pytest

import tests.support.processes  # noqa: F401  (first: sets the s3fs/gcsfs/botocore environment)

pytest_plugins = ["tests.support.s3", "tests.support.gcs", "tests.support.dask_cluster"]

SERVER_FIXTURES = {"s3_server", "s3_bucket", "gcs_server", "gcs_bucket"}
CLUSTER_FIXTURES = {"dask_cluster", "dask_client"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.servers)
        if used & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
