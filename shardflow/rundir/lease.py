"""The run directory's lease: one driver at a time runs a job into a run directory.

Two drivers on one run directory would run the same tasks twice and, with a non-deterministic fn,
leave a summary.json whose sha256 disagrees with the files. A driver (`ShardJob.run`, `shardflow
run`) therefore holds `lease.json` in the run directory while it runs: a random owner token, user,
and the process's identity (host, pid, boot id, PID namespace, start time: rundir.pids), with an
expiry renewed by a background thread every TTL/3. A second driver is refused with who holds the
lease and until when. A lease is taken over when its driver is provably gone (`pids.provably_gone`:
a dead process of this kernel and this PID namespace; a container with the same host name in
another namespace proves nothing), or with `steal=True` (`--steal`) once it has expired.

Taking and renewing are atomic where the storage allows it:

- local run directory: the lease is created with link() (fails when it exists); a takeover first
  creates `lease.json.taken-<digest of the lease read>` with O_EXCL, so of two drivers taking over
  the same dead lease exactly one wins, then renames its lease into place. A holder sees that marker
  for its own lease before each renewal and knows it lost (markers stay: a driver paused past the
  taker's whole run still finds it; one small file per takeover).
- S3 / GCS: conditional writes (storage.conditional): create with If-None-Match / generation 0,
  take over and renew with If-Match on the version read, so a renewal after a takeover fails.
- other stores: a PUT read back after a short settle time, which closes the window a human can hit
  (two `shardflow run` typed at once) but is not a consensus protocol.

A driver that finds its lease taken (`check()`, called by the driver between tasks; a renewal that
was overdue, e.g. after the process was paused past the TTL, is done there and then) raises
LeaseLost: it starts no further task and exits with the new holder named.

Pods (`shardflow worker`) never take it: their tasks are disjoint slices of the plan, and
`worker --finalize` only rebuilds summary.json from the markers.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable

from shardflow.errors import JobError
from shardflow.rundir.layout import LEASE, lease_taken_file
from shardflow.rundir.pids import process_identity, provably_gone
from shardflow.rundir.run_dir import RunDir
from shardflow.storage.protocols import load, protocol_of

DEFAULT_TTL = 60.0  # seconds a lease lives without renewal
SETTLE = 0.3  # stores without conditional writes: seconds between the PUT and reading it back


class LeaseHeld(JobError):
    """Another driver holds the run directory's lease."""


class LeaseLost(JobError):
    """Another driver took this driver's lease (with --steal after it expired): this one must stop."""


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "?"


def _parse(raw: bytes | None) -> dict[str, Any] | None:
    """The lease record in `raw`; a torn or foreign file is an expired lease of an unknown holder."""
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {"expires": 0, "unreadable": True}


def describe_holder(record: dict[str, Any], now: float | None = None) -> str:
    """'user@host pid 123 (expires in 41 s)' for messages."""
    now = time.time() if now is None else now
    try:
        left = float(record.get("expires", 0)) - now
    except (TypeError, ValueError):
        left = -now
    when = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
    if record.get("unreadable") or "host" not in record or "pid" not in record:
        return "an unreadable lease.json (torn, or not written by shardflow; treated as expired)"
    return f"{record.get('user', '?')}@{record['host']} pid {record['pid']} ({when})"


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:20]


class RunLease:
    """Context manager: take the lease on enter (or raise LeaseHeld), renew it, release it on exit;
    `check()` raises LeaseLost once another driver has taken it."""

    def __init__(self, run_dir: RunDir, *, steal: bool = False, ttl: float | None = None) -> None:
        self.run_dir = run_dir
        self.steal = steal
        self.ttl = DEFAULT_TTL if ttl is None else ttl
        self.token = uuid.uuid4().hex
        self.lost: str | None = None  # who took the lease from us, if anyone did
        self._identity = process_identity()
        self._raw: bytes = b""  # what we last wrote (local: its digest names a takeover of it)
        self._version: str | None = None  # conditional stores: the version we last wrote
        self._renewed = 0.0  # time.monotonic() of the last renewal
        self._displaced: set[str] = set()  # tokens of the leases we took over (their late writes are no owner)
        self._made: list[str] = []  # local folders the lease created (deepest first)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        conditional = None if run_dir._local else protocol_of(run_dir.url).conditional_put
        self._put_if: Callable[..., str | None] | None = load(conditional[0]) if conditional else None
        self._version_of: Callable[..., str | None] | None = load(conditional[1]) if conditional else None

    # -- the record ----------------------------------------------------------------------------------
    def _record(self) -> bytes:
        return json.dumps({"token": self.token, "user": _user(), **self._identity,
                           "expires": time.time() + self.ttl, "ttl": self.ttl}).encode()

    def _read_raw(self) -> bytes | None:
        try:
            return self.run_dir.read_bytes(LEASE)
        except FileNotFoundError:
            return None

    def _read(self) -> dict[str, Any] | None:
        return _parse(self._read_raw())

    def _may_take(self, held: dict[str, Any]) -> bool:
        """A lease may be taken when its driver is provably gone (a dead process of this kernel and PID
        namespace), or when it has expired and the caller says steal."""
        if provably_gone(held):
            return True
        try:
            expired = float(held.get("expires", 0)) <= time.time()
        except (TypeError, ValueError):
            expired = True
        return self.steal and expired

    def _refuse(self, held: dict[str, Any]) -> LeaseHeld:
        try:
            expired = float(held.get("expires", 0)) <= time.time()
        except (TypeError, ValueError):
            expired = True
        hint = ("; its driver seems gone: take it over with --steal (steal=True)" if expired else
                "; wait for it to finish, or stop it (a killed driver's lease can be taken with --steal once "
                "it has expired)")
        return LeaseHeld(f"run directory {self.run_dir.url} is in use by another driver: "
                         f"{describe_holder(held)}{hint}")

    def _raced(self) -> LeaseHeld:
        return LeaseHeld(f"run directory {self.run_dir.url}: another driver took the lease over at the same "
                         f"moment: {describe_holder(self._read() or {})}")

    # -- taking it -----------------------------------------------------------------------------------
    def acquire(self) -> None:
        if self.run_dir._local:
            self._acquire_local()
        elif self._put_if is not None:
            self._acquire_conditional()
        else:
            self._acquire_read_back()
        self._renewed = time.monotonic()
        self._thread = threading.Thread(target=self._renew_loop, name="shardflow-lease", daemon=True)
        self._thread.start()

    def _acquire_local(self) -> None:
        path = self.run_dir._path(LEASE)
        folder = os.path.dirname(path)
        while folder and not os.path.isdir(folder):  # made here: removed on release when still empty
            self._made.append(folder)
            folder = os.path.dirname(folder)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for _ in range(3):  # the lease may vanish (released) between our tries: create it then
            if self._create_local(path):
                return
            raw = self._read_raw()
            if raw is None:
                continue
            held = _parse(raw) or {}
            if not self._may_take(held):
                raise self._refuse(held)
            self._take_over_local(raw, held)
            return
        raise self._raced()

    def _create_local(self, path: str) -> bool:
        """Create lease.json only if absent, whole: written to a temp name, then hard-linked into place
        (link fails when the name exists), so no reader ever sees a created but still empty lease."""
        raw = self._record()
        temp = f"{path}.{self.token}.new"
        with open(temp, "wb") as f:
            f.write(raw)
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
        self._raw = raw
        return True

    def _take_over_local(self, raw: bytes, held: dict[str, Any]) -> None:
        """Replace the lease `raw` we judged takeable, unless another driver is taking it over too: the
        marker named after `raw` is created with O_EXCL, so only one of them gets past it."""
        marker = self.run_dir._path(lease_taken_file(_digest(raw)))
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise self._raced() from None
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        if self._read_raw() != raw:  # renewed or replaced since we read it: it is not the lease we judged
            raise self._raced()
        self._displaced.add(str(held.get("token")))
        self._write_local()

    def _write_local(self) -> None:
        raw = self._record()
        self.run_dir.write_bytes(LEASE, raw)  # temp + rename: readers see the old lease or the new
        self._raw = raw

    def _acquire_conditional(self) -> None:
        assert self._put_if is not None and self._version_of is not None
        fs, path = self.run_dir.fs, self.run_dir._path(LEASE)
        version = self._version_of(fs, path)  # before the read: a put_if on it fails if it changed since
        held = None if version is None else self._read()
        if held is not None and not self._may_take(held):
            raise self._refuse(held)
        if held is not None:
            self._displaced.add(str(held.get("token")))
        self._version = self._put_if(fs, path, self._record(), version)
        if self._version is None:
            raise self._raced()

    def _acquire_read_back(self) -> None:
        held = self._read()
        if held is not None and not self._may_take(held):
            raise self._refuse(held)
        self.run_dir.write_bytes(LEASE, self._record())
        time.sleep(SETTLE)
        now = self._read()
        if not now or now.get("token") != self.token:
            raise self._raced()

    # -- keeping it ----------------------------------------------------------------------------------
    def renew(self) -> bool:
        """Extend the lease; False (and `lost` set) when another driver has taken it."""
        with self._lock:
            if self.lost is not None:
                return False
            if self.run_dir._local:
                ok = self._renew_local()
            elif self._put_if is not None:
                version = self._put_if(self.run_dir.fs, self.run_dir._path(LEASE), self._record(), self._version)
                ok = version is not None
                self._version = version or self._version
            else:
                held = self._read()
                ok = held is None or held.get("token") in {self.token, *self._displaced}
                if ok:
                    self.run_dir.write_bytes(LEASE, self._record())
            if ok:
                self._renewed = time.monotonic()
            else:
                self.lost = describe_holder(self._read() or {})
                print(f"shardflow: error: the lease on {self.run_dir.url} was taken by {self.lost}; this "
                      "driver starts no further task", file=sys.stderr)
            return ok

    def _renew_local(self) -> bool:
        taken = self.run_dir._path(lease_taken_file(_digest(self._raw)))
        held = self._read()
        if os.path.exists(taken) or (held is not None and held.get("token") not in {self.token, *self._displaced}):
            return False
        self._write_local()
        return not os.path.exists(taken)  # a takeover between our look and our write: it won

    def check(self) -> None:
        """Raise LeaseLost when another driver holds the lease now. A renewal that is overdue (this
        process was paused past a third of the TTL) is done here first, so a resumed driver learns it
        lost the lease before it starts another task."""
        if self.lost is None and time.monotonic() - self._renewed > self.ttl / 3 + 1:
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - the store is away: the renewal thread keeps trying
                pass
        if self.lost is not None:
            raise LeaseLost(f"run directory {self.run_dir.url}: this driver's lease was taken by {self.lost} "
                            "(with --steal after this driver's lease expired); this driver stopped starting "
                            "tasks: the other driver carries on with the job")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
            except Exception:  # noqa: BLE001 - a store hiccup: try again at the next renewal
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self.lost is None and (self._read() or {}).get("token") == self.token:
                self.run_dir.remove(LEASE)
            for folder in self._made:  # a run refused before it wrote anything leaves no empty run dir behind
                os.rmdir(folder)
        except Exception:  # noqa: BLE001 - never hide the run's own outcome behind a cleanup failure
            pass

    def __enter__(self) -> "RunLease":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
