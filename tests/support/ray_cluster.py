"""The Ray fixtures (see tests/README.md):

- ``ray_cluster`` (session): ``ray start --head`` on 127.0.0.1 plus a second node (``ray start
  --address``), one CPU each, each ``--block`` in its own process group, stopped by pid (SIGTERM,
  then SIGKILL of the group; never ``ray stop``, which would stop every Ray on the machine). Tests
  give its ``address`` to the backend; ``ray_head`` (function) hands it over with this process
  disconnected from any other Ray first.
- ``ray_local`` (function, one Ray per session): ``ray.init(num_cpus=2)`` in this process; a run
  without an address uses it. Shut down at the end of the session, or when a test needs ``ray_head``.

Both skip with the reason when ray is missing or does not start. Usage stats are off
(RAY_USAGE_STATS_ENABLED=0) and token authentication is off for these private clusters (RAY_AUTH_MODE).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.processes import (
    HOST,
    REPO_ROOT,
    START_TIMEOUT,
    _find_executable,
    _kill_group,
    _spawn,
    free_port,
    log_tail,
)

RAY_START_TIMEOUT = max(START_TIMEOUT, 120.0)  # Ray starts slowly on a loaded 2-core machine (20-45 s)
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # small: the tests move job pickles and results, not data

for _name, _value in RAY_ENV.items():  # this process (the driver) too: same auth mode as the nodes
    os.environ.setdefault(_name, _value)


def _pythonpath() -> str:
    """Workers import functions pickled by reference from test modules: the repository root is enough."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(REPO_ROOT)] + inherited)


class RayCluster:
    """A head and a second node on 127.0.0.1. Attributes: ``address`` ("127.0.0.1:PORT"), ``procs``
    (the two ``ray start --block`` Popens), ``workdir``; ``log(name)``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.address = f"{HOST}:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        # a short private temp dir: Ray's socket paths must stay under 107 bytes, and ray_current_cluster
        # stays out of /tmp/ray, where someone's `ray.init()` would otherwise find this cluster
        self.temp_dir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
        self.env = {**os.environ, **RAY_ENV, "PYTHONPATH": _pythonpath()}
        exe = _find_executable("ray")
        self.ray = [exe] if exe else [sys.executable, "-m", "ray.scripts.scripts"]

    def _start(self, name: str, args: list[str]) -> None:
        cmd = [*self.ray, "start", "--block", "--node-ip-address", HOST, "--num-cpus", "1",
               "--object-store-memory", str(OBJECT_STORE_BYTES), *args]
        self.procs[name] = _spawn(cmd, self.workdir / f"{name}.log", cwd=self.workdir, env=self.env)

    def start(self) -> None:
        self._start("head", ["--head", "--port", str(self.port), "--include-dashboard=false",
                             "--temp-dir", self.temp_dir, "--disable-usage-stats"])
        self._wait_nodes(1)
        self._start("node2", ["--address", self.address])
        self._wait_nodes(2)

    def alive_nodes(self) -> int:
        """Live nodes as the head's GCS reports them (`ray status` would need the autoscaler)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        try:
            out = subprocess.run([sys.executable, "-c", code, self.address], env=self.env, capture_output=True,
                                 text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return 0
        lines = out.stdout.strip().splitlines()
        return int(lines[-1]) if lines and lines[-1].isdigit() else 0

    def _wait_nodes(self, n: int) -> None:
        deadline = time.monotonic() + RAY_START_TIMEOUT
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"`ray start` ({name}) exited with status {proc.returncode}\n{self.log(name)}")
            if self.alive_nodes() >= n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray did not list {n} nodes within {RAY_START_TIMEOUT:.0f} s\n{self.log('head')}")
            time.sleep(1.0)

    def log(self, name: str = "head", nbytes: int = 3000) -> str:
        return log_tail(self.workdir / f"{name}.log", nbytes)

    def close(self) -> None:
        """SIGTERM each `ray start --block` (it stops its raylet, GCS and workers), then SIGKILL the group."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            _kill_group(proc)
        self.procs = {}
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    cluster = RayCluster(tmp_path_factory.mktemp("ray"))
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001
        cluster.close()
        pytest.skip(f"a Ray cluster could not start here: {exc}")
    yield cluster
    cluster.close()


@pytest.fixture
def ray_head(ray_cluster):
    """The cluster, with this process connected to no other Ray (a run given its address joins it)."""
    _disconnect()
    yield ray_cluster
    _disconnect()


@pytest.fixture(scope="session")
def _ray_local_session():
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    yield
    _disconnect()


@pytest.fixture
def ray_local(_ray_local_session):
    """`ray.init(num_cpus=2)` in this process (started on first use, kept for the next test)."""
    import ray

    if not ray.is_initialized():
        os.environ["PYTHONPATH"] = _pythonpath()  # the raylet and its workers inherit it
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                     object_store_memory=OBJECT_STORE_BYTES)
        except Exception as exc:  # noqa: BLE001
            pytest.skip(f"a local Ray could not start here: {exc}")
    return ray
