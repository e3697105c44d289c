"""A shell command per sample (tarproc's `-c CMD`): ShellCommand (the job's fn) and ShellJob.

For each sample: a fresh private directory (mkdtemp, mode 0700, named by the worker's pid so that the
directories of a killed worker are swept by the next one; in /dev/shm unless TMPDIR or
`tmpdir` say otherwise, see default_tmpdir) receives the members as
`<key-basename>.<ext>` (names made safe by shell_files: member names are data), `sh -c CMD` runs there
with no stdin, a timeout, its own session and a clean environment (PATH, HOME and TMPDIR pointing
into the sample's directory, LANG/LC_ALL=C.UTF-8, plus what the user passes); when it exits (or times
out) its process group is killed and then every process it started, even in another session
(shell_procs.Tether); then every file in the directory is read back as the output sample: deleted
files dropped, new files added, `__key__` kept; no file left drops the sample (files of
shell_files.STREAM_FROM bytes and more come back as open descriptors, FileValue, that the shard writer
streams: the directory is removed right after read-back, the descriptor keeps the data). A non-zero exit or a
timeout raises CommandFailed (a SampleError) naming the command, its exit status and the tail of its
stderr, so the job's error policy counts it and errors/ logs it (without a traceback through
shardflow: the message says everything).

`env` values are written into job.pkl like every setting, so a secret-looking name (the rule of
storage.options.is_secret_name, the one `shardflow k8s --env` applies) is refused with a pointer to
`pass_env` / `--pass-env`, which copies the value from the worker's environment when the command runs.

`parallel=N` runs N samples of a task at once in threads (each waits on its subprocess with the GIL
released): run_task applies the fn's `arrange_samples` stage to the input stream, which starts the
commands ahead and hands the results back in input order, so the output is the same as with N=1.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import types
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from shardflow.errors import JobError, SampleError
from shardflow.job.shard_job import ShardJob
from shardflow.job.shell_files import read_sample, write_sample
from shardflow.job.shell_procs import Tether
from shardflow.rundir.pids import pid_alive
from shardflow.storage.options import is_secret_name
from shardflow.text import safe, safe_repr

STDERR_TAIL = 2000  # characters of the command's stderr kept in the error message
_RESULT = "__shell_result__"  # where arrange_samples leaves a finished command's outcome
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class CommandFailed(SampleError):
    """The command exited non-zero or ran out of time on one sample (reason: the command, its exit
    status, its stderr tail). The reason says all there is: no traceback is kept for it, and when it
    fails every sample the run stops with `every_sample_failed`'s message, not as a bug in process()."""

    hide_traceback = True

    @staticmethod
    def every_sample_failed(first: dict[str, Any], failed: int, total: int) -> str:
        """The run's message when the command failed on every sample (task.failures.user_bug)."""
        return (f"the command failed on every sample ({failed} of {total}), e.g. shard {safe(first['shard'])}, "
                f"key {safe_repr(first['key'])}: {safe(first['reason'], 2000)}; the run stops: fix the command "
                "(try it by hand in a folder holding one sample's files) and run the same command again")


class ShellCommand:
    """fn(sample) -> sample: run `command` in a private directory holding the sample's files.

    Picklable (job.pkl, Dask, pods): only text and numbers. `env` adds variables to the clean
    environment; `pass_env` names variables copied from the worker's own environment.
    """

    def __init__(self, command: str, *, parallel: int = 1, timeout: float = 600.0,
                 env: Mapping[str, str] | None = None, pass_env: Sequence[str] = (),
                 tmpdir: str | None = None, shell: str = "/bin/sh") -> None:
        if not isinstance(command, str) or not command.strip():
            raise JobError("the shell command must be a non-empty string")
        if parallel < 1 or timeout <= 0:
            raise JobError("parallel must be >= 1 and timeout > 0")
        self.command = command
        self.parallel = int(parallel)
        self.timeout = float(timeout)
        self.env = dict(env or {})
        for name in self.env:
            if is_secret_name(name):
                raise JobError(f"env {name} looks like a secret and would be written in clear into the run "
                               f"directory (job.pkl): export it and pass it by name instead (--pass-env {name}; "
                               f"in a job file PASS_ENV = [{name!r}])")
        self.pass_env = tuple(pass_env)
        self.tmpdir = tmpdir
        self.shell = shell
        self.__name__ = "shell"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any] | None:
        if _RESULT in sample:  # started ahead by arrange_samples
            result = sample[_RESULT]
            if isinstance(result, BaseException):
                raise result
            return result
        return self.run(sample)

    def arrange_samples(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The stream stage run_task applies: with parallel > 1, run commands ahead in threads and
        yield each input sample, in input order, carrying its outcome for __call__."""
        if self.parallel == 1:
            yield from samples
            return
        pending: deque[tuple[dict[str, Any], Future[Any]]] = deque()
        live = Running()  # commands running now: killed if the task stops
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="shardflow-sh") as pool:
            try:
                for sample in samples:
                    pending.append((sample, pool.submit(self._outcome, sample, live)))
                    while len(pending) > 2 * self.parallel or (pending and pending[0][1].done()):
                        yield _finished(*pending.popleft())
                while pending:
                    yield _finished(*pending.popleft())
            finally:  # the task ended early (an error, Ctrl-C): start nothing more, end what runs
                for _, future in pending:
                    future.cancel()
                live.stop()

    def _outcome(self, sample: dict[str, Any], live: "Running") -> Any:
        try:
            return self.run(sample, live)
        except Exception as exc:  # noqa: BLE001 - handed to __call__, which raises it under the policy
            return exc

    def run(self, sample: dict[str, Any], live: "Running | None" = None) -> dict[str, Any] | None:
        """Run the command on one sample (raw bytes) and return the files it leaves, as a sample
        (None, which drops the sample, when it leaves none: `[ -s x.txt ] || rm -f *` filters)."""
        key, url = sample["__key__"], sample.get("__url__", "")
        root = self.tmpdir or default_tmpdir() or tempfile.gettempdir()
        sweep_dead_sample_dirs(root)
        top = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=root)
        try:
            work = os.path.join(top, "s")
            os.mkdir(work, 0o700)
            write_sample(work, sample)
            stderr_path = os.path.join(top, "stderr")
            with open(stderr_path, "wb") as stderr:
                code = self._execute(work, top, stderr, live)
            if code != 0:
                raise CommandFailed(_failure(self.command, code, self.timeout, _tail(stderr_path)), url=url, key=key)
            out = read_sample(work, key, url)
            return out if len(out) > 1 else None  # no file left: the sample is dropped (a filter)
        finally:
            shutil.rmtree(top, ignore_errors=True)

    def _execute(self, cwd: str, home: str, stderr: Any, live: "Running | None") -> int | None:
        """Exit status of the command (None: killed on timeout). Its whole process group is killed then,
        and every process it started in another session (Tether)."""
        live = live or Running()
        tether = Tether()
        try:
            proc = live.start([self.shell, "-c", self.command], cwd=cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=stderr, env=tether.environment(self.environment(home)),
                              start_new_session=True, close_fds=True, pass_fds=(tether.write_fd,))
            tether.started()
            try:
                return proc.returncode if _wait(proc, self.timeout) else None
            finally:
                _kill_group(proc)
                tether.sweep()
                live.discard(proc)
        finally:
            tether.close()

    def environment(self, home: str) -> dict[str, str]:
        """The clean environment: PATH, HOME/TMPDIR (private), a UTF-8 locale, then pass_env and env."""
        env = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "HOME": home, "TMPDIR": home,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        env.update({name: os.environ[name] for name in self.pass_env if name in os.environ})
        env.update(self.env)
        return env


class Running:
    """The commands one task has running (threads of -p N), so that a task that stops can end them:
    after stop(), a command about to start is refused and the running ones are killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._stopped = False

    def start(self, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if self._stopped:
            raise CommandFailed("not started: the task is stopping")
        proc = subprocess.Popen(args, **kwargs)  # outside the lock: commands start in parallel
        with self._lock:
            self._procs.add(proc)
            stopped = self._stopped
        if stopped:  # stop() ran while it started: it did not see this one
            _kill_group(proc, wait=False)
        return proc

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc, wait=False)


_PREFIX = "shardflow-sh-"  # + the pid of the process that made the sample's directory + mkdtemp's part
_SWEPT: set[tuple[int, str]] = set()  # (pid, root): each process sweeps a root once


def sweep_dead_sample_dirs(root: str) -> int:
    """Remove the sample directories that processes no longer alive left in `root`: a worker killed
    with SIGKILL never runs its `finally`, and in /dev/shm each directory holds RAM until a reboot. A
    directory is named by the pid that made it; one whose process lives on (or that we may not signal)
    is left alone. Once per process and root: a listing of the root, not one per sample."""
    if (os.getpid(), root) in _SWEPT:
        return 0
    _SWEPT.add((os.getpid(), root))
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        pid = name[len(_PREFIX):].partition("-")[0]
        if not (name.startswith(_PREFIX) and pid.isdigit()) or pid_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed += 1
    return removed


_SHM = "/dev/shm"
_SHM_FREE = 1 << 30  # /dev/shm is used only when it has this much room (Docker's default is 64 MiB)


def default_tmpdir() -> str | None:
    """Where sample directories go without `tmpdir`: $TMPDIR when set, else /dev/shm when it is a
    writable RAM disk with room (creating and removing a directory and its files costs ~0.03 ms
    there, ~2 ms each on a busy disk: most of a command's overhead), else the system default."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        stat = os.statvfs(_SHM)
    except (OSError, AttributeError):
        return None
    if stat.f_bavail * stat.f_frsize >= _SHM_FREE and os.access(_SHM, os.W_OK | os.X_OK):
        return _SHM
    return None


def _finished(sample: dict[str, Any], future: Future[Any]) -> dict[str, Any]:
    return {**sample, _RESULT: future.result()}


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for the command to exit within `timeout` (False: it did not). A pidfd wakes us the moment
    it exits; Popen.wait(timeout) polls with sleeps, which cost ~10 ms per sample."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: Popen's polling wait
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(timeout * 1000)
    finally:
        os.close(fd)
    if ready:
        proc.wait()
        return True
    return False


def _kill_group(proc: subprocess.Popen[bytes], wait: bool = True) -> None:
    """End the command and anything it left running in its group (a timeout, this task interrupted,
    or background jobs of a command that has exited)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not wait:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - STDERR_TAIL * 4))
        text = f.read().decode("utf-8", "replace")
    return text[-STDERR_TAIL:].strip()


def _failure(command: str, code: int | None, timeout: float, stderr: str) -> str:
    shown = safe_repr(command, 200)
    if code is None:
        what = f"command {shown} timed out after {timeout:g} s"
    elif code < 0:
        what = f"command {shown} killed by signal {-code}"
    else:
        what = f"command {shown} exited with status {code}"
    return f"{what}; stderr: {stderr!r}" if stderr else f"{what} (no stderr)"


class ShellJob(ShardJob):
    """A ShardJob whose per-sample step is a shell command (see ShellCommand): tarproc -c as a job.

    It plans, resumes, and runs on every backend and as Kubernetes/Argo manifests like any job; the
    command (not the environment values, which may be secret) is part of the plan's fingerprint.
    """

    def __init__(self, command: str, inputs: Any, outputs: Any, *, parallel: int = 1, timeout: float = 600.0,
                 env: Mapping[str, str] | None = None, pass_env: Sequence[str] = (), tmpdir: str | None = None,
                 **kwargs: Any) -> None:
        if kwargs.get("decode") is not None:
            raise JobError("a ShellJob hands the command raw member bytes: decode must be None")
        fn = ShellCommand(command, parallel=parallel, timeout=timeout, env=env, pass_env=pass_env, tmpdir=tmpdir)
        params = dict(kwargs.pop("params", None) or {})
        params.setdefault("command", command)
        params.setdefault("timeout", float(timeout))
        kwargs.setdefault("name", "shell")
        super().__init__(fn, inputs, outputs, params=params, **kwargs)


# -- job files whose per-sample step is a shell command ---------------------------------------
# Job files whose per-sample step is a shell command: `COMMAND = "..."` instead of `def process`.
#
#     COMMAND = "convert *.jpg -resize 256x256 small.png && rm *.jpg"
#     PARALLEL = 4             # optional: samples of a task at once (threads)
#     TIMEOUT = 120            # optional: seconds per sample
#     ENV = {"OMP_NUM_THREADS": "1"}   # optional: added to the clean environment
#     PASS_ENV = ["HOME_CACHE"]        # optional: variables copied from the worker's environment
#     JOB = dict(maxcount=1000)        # as in any job file
#
# load_job_file calls `install_command(module, path)` right after the file ran: the module's `process`
# becomes a ShellCommand (above), so everything else (overrides, plan, job.pkl, Dask,
# `shardflow k8s`/`argo`) treats the file like any other job.
_COMMAND_SETTINGS = {"PARALLEL": "parallel", "TIMEOUT": "timeout", "ENV": "env", "PASS_ENV": "pass_env",
                     "TMPDIR": "tmpdir"}


def install_command(module: types.ModuleType, path: Path) -> types.ModuleType:
    """Give a COMMAND job file its `process` (a ShellCommand); other job files pass unchanged."""
    names = vars(module)
    command = names.get("COMMAND")
    if command is None:
        return module
    if "process" in names:
        raise JobError(f"job file {path} defines both COMMAND and process(); keep one")
    job = names.get("JOB") if isinstance(names.get("JOB"), dict) else {}
    if names.get("DECODE") is not None or job.get("decode") is not None:
        raise JobError(f"job file {path}: a COMMAND job hands the command raw member bytes; remove DECODE")
    kwargs = {arg: names[name] for name, arg in _COMMAND_SETTINGS.items() if name in names}
    try:
        module.process = ShellCommand(command, **kwargs)  # type: ignore[attr-defined]
    except (JobError, TypeError, ValueError) as exc:
        raise JobError(f"job file {path}: bad COMMAND settings: {exc}") from None
    return module
