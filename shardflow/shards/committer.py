"""Committing finished shards in the background while the next one is written.

A shard's commit waits on the end of its writes, an fsync and a rename, or the last part of an
upload; doing it in one background thread hides that wait. Shards are committed one at a time and
in order, and their receipts (and any error) are handed back to the caller's thread, so callbacks
never run in a thread the caller did not expect.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, Protocol, TypeVar

Receipt = TypeVar("Receipt", covariant=True)
R = TypeVar("R")


class Committable(Protocol[Receipt]):
    """What the committer needs of a writer: close() commits and returns a receipt; abort() drops."""

    def close(self) -> Receipt: ...

    def abort(self) -> None: ...


class BackgroundCommitter(Generic[R]):
    """Closes finished writers in one background thread, in order, at most one at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._todo: deque[Committable[R] | None] = deque()
        self._done: list[R] = []
        self._error: BaseException | None = None
        self._busy = 0  # submitted and not finished
        self._thread: threading.Thread | None = None

    def submit(self, writer: Committable[R]) -> None:
        """Queue `writer` for closing once the previous one is done; raise an earlier commit's error
        (then `writer` is aborted instead)."""
        cond = self._cond
        with cond:
            while self._busy and self._error is None:  # the previous shard is still committing
                cond.wait()
            if self._error is not None:
                writer.abort()
                self.raise_error()
            self._busy += 1
            self._todo.append(writer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardflow-commit", daemon=True)
                self._thread.start()
            cond.notify_all()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._todo:
                    cond.wait()
                writer = self._todo.popleft()
            if writer is None:
                return
            try:
                info = writer.close()
                with cond:
                    self._done.append(info)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with cond:
                    if self._error is None:
                        self._error = exc
            finally:
                with cond:
                    self._busy -= 1
                    cond.notify_all()

    @property
    def started(self) -> bool:
        """Whether a writer was ever submitted (its thread started)."""
        return self._thread is not None

    def has_news(self) -> bool:
        """Whether receipts or an error wait to be handed over (a cheap check, without the lock)."""
        return bool(self._done) or self._error is not None

    def take_done(self) -> list[R]:
        """The receipts of the writers closed since the last call, in order."""
        with self._cond:
            done, self._done = self._done, []
        return done

    def raise_error(self) -> None:
        """Raise (once) the error of a commit that failed, if any."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self) -> None:
        """Until every submitted writer is closed (or failed)."""
        with self._cond:
            while self._busy:
                self._cond.wait()

    def stop(self, join: bool = True) -> None:
        """End the background thread (after what is queued); `join=False` from finalisers."""
        thread = self._thread
        if thread is not None:
            self._thread = None
            with self._cond:
                self._todo.append(None)
                self._cond.notify_all()
            if join and thread is not threading.current_thread():
                thread.join()
