"""A real one-node Slurm for the tests and bench/bench_slurm.py: munged, slurmctld -D and slurmd -D.

Debian's `slurm-wlm` and `munge` (scripts/setup.sh installs them where it is root) run a whole cluster
on this machine as root: one node with 2 CPUs, `proctrack/linuxproc` and `task/none` (no cgroups in a
container), no accounting database. Every file (munge key and socket, slurm.conf, state, spool, logs)
lives in one temp directory; the daemons are started as session leaders and stopped by pid. Clients
(`sbatch`, `squeue`, `scontrol`) find the cluster through SLURM_CONF, which `SlurmCluster.env()` sets.

The fixture `slurm_cluster` is session-scoped (one start of ~5-40 s per test session) and skips, with
the reason, where the binaries are missing, this is not root, or a daemon does not come up.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.processes import ServerStartError, _kill_group, _spawn, free_ports, log_tail

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel")
START_TIMEOUT = 60.0

SLURM_CONF = """\
ClusterName=shardflowtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=5
SchedulerParameters=defer_batch=0
ReconfigFlags=KeepPartInfo
PlugStackConfig={root}/plugstack.conf
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here (binaries missing, not root, a daemon did not come up): tests skip with it."""


class SlurmCluster:
    """munged + slurmctld + slurmd in `root`, started and stopped by pid."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}

    def env(self) -> dict[str, str]:
        """The variables clients need (SLURM_CONF; munge's socket is in slurm.conf)."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge, or "
                                   "scripts/setup.sh as root)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("the one-node test Slurm runs its daemons as root; this is not root")
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "plugstack.conf").write_text("")
        ctld_port, slurmd_port = free_ports(2)
        self.conf.write_text(SLURM_CONF.format(host=self.host, root=self.root, ctld_port=ctld_port,
                                               slurmd_port=slurmd_port))
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.root}/munge.socket",
                               f"--pid-file={self.root}/munged.pid", f"--log-file={self.root}/munged.log",
                               f"--seed-file={self.root}/munged.seed"])
        self._wait("munged", lambda: (self.root / "munge.socket").exists())
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self._client(["scontrol", "ping"]).returncode == 0)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait("slurmd", self._node_idle)

    def stop(self) -> None:
        """Cancel what still runs, then stop every daemon by pid (its process group, SIGKILL), and the
        slurmstepd processes of this cluster (their own sessions, re-parented to init: found by pid in
        /proc through the SLURM_CONF they were started with) that would otherwise linger."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.cancel_all(timeout=20)
        steps = self._step_pids()
        for name in reversed(DAEMONS):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _kill_group(proc)
        for pid in steps + self._step_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _step_pids(self) -> list[int]:
        """Pids of the slurmstepd processes started by this cluster's slurmd."""
        mine = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() == "slurmstepd" and \
                        mine in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job of the cluster (between tests) and wait until the queue is empty."""
        self._client(["scancel", "--full", "--user=root"])
        deadline = time.monotonic() + timeout
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.5)

    def queue(self) -> list[str]:
        """`squeue` lines "JOBID STATE" of every job still known as pending or running."""
        result = self._client(["squeue", "--noheader", "--array", "--format=%i %T"])
        return [line for line in result.stdout.splitlines() if line.strip()]

    def log(self, name: str = "slurmctld") -> str:
        return log_tail(self.root / f"{name}.log")

    # -- helpers -----------------------------------------------------------------------------------------
    def _client(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **self.env()}, timeout=30)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs[name] = _spawn(argv, self.root / f"{name}.out", cwd=self.root, env={**os.environ, **self.env()})

    def _node_idle(self) -> bool:
        result = self._client(["sinfo", "--noheader", "--format=%T"]) if shutil.which("sinfo") else \
            self._client(["scontrol", "show", "node", self.host])
        return "idle" in result.stdout.lower()

    def _wait(self, name: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        proc = self.procs[name]
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name} ---\n{log_tail(p)}" for p in sorted(self.root.glob("*.out"))
                                 + sorted(self.root.glob("*.log")))
                self.stop()
                raise SlurmUnavailable(f"{name} did not come up (exit {proc.poll()}):\n{logs}")
            time.sleep(0.2)


def start_cluster(root: Path | None = None) -> SlurmCluster:
    """A started one-node cluster in `root` (a new temp dir by default); raises SlurmUnavailable."""
    cluster = SlurmCluster(Path(root or tempfile.mkdtemp(prefix="shardflow-slurm-")))
    try:
        cluster.start()
    except ServerStartError as exc:
        raise SlurmUnavailable(str(exc)) from exc
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """The session's one-node Slurm; SLURM_CONF set for this process (shardflow calls sbatch/squeue)."""
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
