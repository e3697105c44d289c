"""Ending everything a shell command started, not just its process group.

A command runs in its own session (`start_new_session`), and killing that process group ends what
an ordinary command leaves behind. A child that calls `setsid` (or `setsid -f`, `nohup ... &` in a
new session, a daemon that double-forks) leaves the group and the session, and used to outlive the
job (297 of 300 in a test), still writing into a directory that is read back or removed.

`Tether` marks every process of one command twice, with things a child inherits whatever session
it moves to: the write end of a pipe (an inherited descriptor: every process holding it keeps the
pipe open) and an environment variable holding a random token. When the command has exited:

- the cheap check, one non-blocking read: if every write end is closed, no process of the command
  holds the descriptor and nothing more is done (the common case costs one pipe per command);
- else the processes are found by a walk of /proc (those of this user holding that pipe, or whose
  environment carries the token), killed with SIGKILL, and the walk repeats until none is left
  (bounded): a process forking while it is killed is found on the next round.

Why not a subreaper (prctl PR_SET_CHILD_SUBREAPER) or a cgroup: a subreaper in the worker would adopt
every orphan of the worker (pipe: inputs' children too) and would have to reap them with waitpid(-1),
which steals the exit status of the worker's other subprocess.Popen children; setting it in the
command's own process needs a preexec_fn, which is unsafe in a threaded worker (`-p N`). cgroups need
a delegated, writable hierarchy, which most containers do not give. What remains uncovered: a process
that both closes the inherited descriptor and clears its environment before its parent exits
(a deliberately hostile command; run those in a container or a pod, docs/shell-tools.md).
"""

from __future__ import annotations

import os
import secrets
import signal
import time

TOKEN_VARIABLE = "SHARDFLOW_COMMAND_TOKEN"
_ROUNDS = 20  # kill rounds before giving up on a process that keeps forking


class Tether:
    """The marks of one command's processes (a pipe and a token) and the sweep that ends them."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self._read, self.write_fd = os.pipe()  # not inheritable: only the command gets it (pass_fds)
        os.set_blocking(self._read, False)
        self._inode = os.fstat(self._read).st_ino

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, TOKEN_VARIABLE: self.token}

    def started(self) -> None:
        """Close this process's write end once the command holds its own copy (pass_fds)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def sweep(self) -> int:
        """Kill every process still marked as the command's; returns how many were killed."""
        killed = 0
        for _ in range(_ROUNDS):
            if self._all_closed():
                return killed
            found = _marked(self.token.encode(), f"pipe:[{self._inode}]")
            if not found:
                return killed
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)  # let the kernel close the killed processes' descriptors
        return killed

    def close(self) -> None:
        self.started()
        os.close(self._read)

    def _all_closed(self) -> bool:
        """Whether no process holds the write end any more (a read gives end of file)."""
        try:
            while os.read(self._read, 1 << 16):  # a command may have written into it
                pass
        except BlockingIOError:
            return False
        return True


def _marked(token: bytes, pipe: str) -> list[int]:
    """Pids of this user's processes that hold `pipe` open or carry `token` in their environment.

    A direct child of this process is never taken for holding the pipe: with `-p N`, another thread's
    command may be between fork and exec, holding a copy of every descriptor of this process for a
    moment (close_fds closes it before the exec); the command's own shell is ended by then."""
    me, uid = os.getpid(), os.getuid()
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): the process group kill is all there is
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        base = f"/proc/{name}"
        try:
            if os.stat(base).st_uid != uid:
                continue
            with open(f"{base}/environ", "rb") as f:
                if token in f.read():
                    found.append(int(name))
                    continue
            with open(f"{base}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                    continue
            for fd in os.listdir(f"{base}/fd"):
                if os.readlink(f"{base}/fd/{fd}") == pipe:
                    found.append(int(name))
                    break
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found
