"""Process streams: `pipe:CMD` URLs and `-` (stdin / stdout).

`pipe:CMD` runs a shell command and reads its stdout (or writes its stdin). It is refused unless the
caller allows it (`allow_pipe=True` or SHARDFLOW_ALLOW_PIPE=1), because a spec often comes from a
config file and should not be able to run programs. `-` is the process's own stdin or stdout.

The refusal (`PipeNotAllowed`) is a setting to change, not I/O trouble: it is never retried, a job
meets it when it is planned (`refuse_pipes`, called by ShardJob.prepare), before any task runs, and
the one message (`refusal`) says how to allow pipes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import IO, TYPE_CHECKING, Any, Iterable

from shardflow.errors import PipeError, PipeNotAllowed

if TYPE_CHECKING:
    from shardflow.storage.schemes import OpenRequest

PIPE_ENV = "SHARDFLOW_ALLOW_PIPE"


def pipe_allowed(allow_pipe: bool | None) -> bool:
    """An explicit `allow_pipe` wins; None asks the environment (SHARDFLOW_ALLOW_PIPE)."""
    if allow_pipe is not None:
        return allow_pipe
    return os.environ.get(PIPE_ENV, "") not in ("", "0", "false", "no")


def refusal(url: str) -> PipeNotAllowed:
    """THE refusal of a `pipe:` URL, one line saying how to allow pipes (jobs, tools, the reader)."""
    return PipeNotAllowed(
        "pipe: URLs run shell commands and are off by default; allow them with allow_pipe=True "
        f"(`shardflow run --set allow_pipe=true`, `--allow-pipe` of the tools), or {PIPE_ENV}=1 where no "
        "allow_pipe is given",
        url=url,
    )


def refuse_pipes(urls: Iterable[str], allow_pipe: bool | None) -> None:
    """Raise the refusal for the first `pipe:` URL of `urls` unless pipes are allowed: what a job checks
    of its planned inputs and outputs, so a refused pipe stops it before any task (and no retry) runs."""
    if pipe_allowed(allow_pipe):
        return
    for url in urls:
        if url.startswith("pipe:"):
            raise refusal(url)


class StdStream:
    """stdin/stdout wrapper whose close() flushes but leaves the process's stream open."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(n)

    def write(self, data: bytes) -> int:
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if hasattr(self._stream, "flush") and self._stream.writable():
            self._stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PipeStream:
    """A `pipe:CMD` stream: the command's stdout (read) or stdin (write).

    The subprocess never outlives the stream: close() closes the pipe, reaps the process and raises
    PipeError if it exited non-zero, so a failing `curl` is an error rather than a short shard. A
    reader closed before the end kills the command instead of waiting for it.
    """

    def __init__(self, url: str, mode: str, *, allow_pipe: bool | None = None) -> None:
        if not pipe_allowed(allow_pipe):
            raise refusal(url)
        self.url = url
        self.mode = mode
        command = url[len("pipe:"):]
        # its own process group, so that stopping it stops every command of a pipeline, not only `sh`
        if mode == "rb":
            self._proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, bufsize=1 << 20,
                                          start_new_session=True)
            self._pipe = self._proc.stdout
        else:
            self._proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, bufsize=1 << 20,
                                          start_new_session=True)
            self._pipe = self._proc.stdin
        self._eof = False
        self._killed = False
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        # read1: hand over what the command has written so far, so a slow command's first sample is
        # not held back until a whole buffer fills
        data = self._pipe.read() if n < 0 else self._pipe.read1(n)
        if n < 0 or not data:
            self._eof = True
        return data

    def write(self, data: bytes) -> int:
        return self._pipe.write(data)

    def flush(self) -> None:
        if self.mode == "wb":
            self._pipe.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.mode == "rb" and not self._eof:
            rest = self._pipe.read(1)
            if rest:  # the reader stopped early: do not wait for a command that may never end
                self._kill()
        try:
            self._pipe.close()
        except BrokenPipeError:
            pass
        status = self._proc.wait()
        if status != 0 and not self._killed:
            raise PipeError(f"command exited with status {status}", url=self.url)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._killed = True

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self._kill()
            self._proc.wait()


# -- the openers the protocol records name for "-" and "pipe" --------------------------------------


def open_stdin(request: OpenRequest) -> Any:
    return StdStream(sys.stdin.buffer)


def open_stdout(request: OpenRequest) -> Any:
    return StdStream(sys.stdout.buffer)


def read_pipe(request: OpenRequest) -> Any:
    return PipeStream(request.url, "rb", allow_pipe=request.allow_pipe)


def write_pipe(request: OpenRequest) -> Any:
    return PipeStream(request.url, "wb", allow_pipe=request.allow_pipe)
