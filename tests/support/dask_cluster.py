"""The ``dask_cluster`` (session) and ``dask_client`` fixtures: ``dask scheduler`` + two ``dask worker``
subprocesses (one process group each, so one can be SIGKILLed); see tests/README.md."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import (
    HOST,
    REPO_ROOT,
    START_TIMEOUT,
    ServerStartError,
    _find_executable,
    _kill_group,
    _spawn,
    free_port,
    log_tail,
)


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
        # Workers import functions pickled by reference from test modules (``tests.backends.test_dask``:
        # tests/ is a package, so the repository root is all they need on their path).
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        pythonpath = [str(REPO_ROOT)] + inherited
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
