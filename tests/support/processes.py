"""What the server fixtures share: free ports, process groups killed with SIGKILL, log tails, and
``_Server`` (a subprocess stopped and started again on the same ports and data).

Importing this module sets the environment s3fs / gcsfs / botocore need before they are imported
(tests/conftest.py imports it first).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

# gcsfs probes every bucket for hierarchical-namespace support and waits ~60 s per bucket on an
# emulator unless this is off.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
# s3fs/botocore need a region to sign with; give it here, not as client_kwargs["region_name"].
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# No instance-metadata credential probing (a 1-2 s timeout per client without network).
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


TESTS_DIR = Path(__file__).resolve().parents[1]
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
