"""The run directory's lease: one driver at a time runs a job into a run directory.

Two drivers on one run directory would run the same tasks twice and, with a non-deterministic fn,
leave a summary.json whose sha256 disagrees with the files. A driver (`ShardJob.run`, `shardflow
run`) therefore holds `lease.json` in the run directory while it runs: owner token, user, host, pid
and an expiry, renewed by a background thread every TTL/3. A second driver is refused with who holds
the lease and until when. A lease whose driver was a process of this host that no longer exists is
taken over; one from another host is taken over with `steal=True` (`--steal`) once it has expired.

Pods (`shardflow worker`) never take it: their tasks are disjoint slices of the plan, and
`worker --finalize` only rebuilds summary.json from the markers.

Taking the lease is atomic on a local run directory (O_EXCL); on object stores it is a PUT read back
after a short settle time, which closes the window a human can hit (two `shardflow run` typed at once)
but is not a consensus protocol.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any

from shardflow.errors import JobError
from shardflow.rundir.layout import LEASE
from shardflow.rundir.pids import pid_alive
from shardflow.rundir.run_dir import RunDir

DEFAULT_TTL = 60.0  # seconds a lease lives without renewal
SETTLE = 0.3  # object stores: seconds between the PUT and reading it back


class LeaseHeld(JobError):
    """Another driver holds the run directory's lease."""


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "?"


def describe_holder(record: dict[str, Any], now: float | None = None) -> str:
    """'user@host pid 123 (expires in 41 s)' for messages."""
    now = time.time() if now is None else now
    left = float(record.get("expires", 0)) - now
    when = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
    return f"{record.get('user', '?')}@{record.get('host', '?')} pid {record.get('pid', '?')} ({when})"


class RunLease:
    """Context manager: take the lease on enter (or raise LeaseHeld), renew it, release it on exit."""

    def __init__(self, run_dir: RunDir, *, steal: bool = False, ttl: float = DEFAULT_TTL) -> None:
        self.run_dir = run_dir
        self.steal = steal
        self.ttl = ttl
        self.token = uuid.uuid4().hex
        self.lost: str | None = None  # who took the lease from us, if anyone did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict[str, Any]:
        return {"token": self.token, "user": _user(), "host": socket.gethostname(), "pid": os.getpid(),
                "expires": time.time() + self.ttl, "ttl": self.ttl}

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.run_dir.read_bytes(LEASE))
        except FileNotFoundError:
            return None
        except ValueError:  # a torn or foreign file: treat as expired
            return {"expires": 0}

    def _create_local(self) -> bool:
        """Create lease.json only if absent, whole: written to a temp name, then hard-linked into place
        (link fails when the name exists), so no reader ever sees a created but still empty lease."""
        path = self.run_dir._path(LEASE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.{self.token}.new"
        with open(temp, "w") as f:
            json.dump(self._record(), f)
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
        return True

    def _may_take(self, held: dict[str, Any]) -> bool:
        """A lease may be taken when its driver is provably gone (a dead process of this host), or when
        it has expired and the caller says steal."""
        pid = held.get("pid")
        if held.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
            return True
        return self.steal and float(held.get("expires", 0)) <= time.time()

    def acquire(self) -> None:
        if self.run_dir._local and self._create_local():
            self._start_renewing()
            return
        held = self._read()
        if held is not None and not self._may_take(held):
            expired = float(held.get("expires", 0)) <= time.time()
            hint = ("; its driver seems gone: take it over with --steal (steal=True)" if expired else
                    "; wait for it to finish, or stop it (a killed driver's lease can be taken with --steal once "
                    "it has expired)")
            raise LeaseHeld(f"run directory {self.run_dir.url} is in use by another driver: "
                            f"{describe_holder(held)}{hint}")
        self.run_dir.write_bytes(LEASE, json.dumps(self._record()).encode())
        if not self.run_dir._local:
            time.sleep(SETTLE)
        now = self._read()
        if not now or now.get("token") != self.token:
            raise LeaseHeld(f"run directory {self.run_dir.url}: another driver took the lease at the same time: "
                            f"{describe_holder(now or {})}")
        self._start_renewing()

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="shardflow-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                held = self._read()
                if held is not None and held.get("token") != self.token:
                    self.lost = describe_holder(held)
                    print(f"shardflow: warning: the lease on {self.run_dir.url} was taken by {self.lost}; "
                          "two drivers now run this job", file=sys.stderr)
                    return
                self.run_dir.write_bytes(LEASE, json.dumps(self._record()).encode())
            except Exception:  # noqa: BLE001 - a store hiccup: try again at the next renewal
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            held = self._read()
            if held is not None and held.get("token") == self.token:
                self.run_dir.remove(LEASE)
        except Exception:  # noqa: BLE001 - never hide the run's own outcome behind a cleanup failure
            pass

    def __enter__(self) -> "RunLease":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
