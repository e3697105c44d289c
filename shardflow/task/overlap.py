"""Two bounded hand-offs between threads, so the CPU stages of a batched task overlap its fn:

    ReadAhead:  a thread runs read + decode and queues the next batch while fn works on this one
    Sink:       a thread encodes + writes the previous batch's outputs, in order

Each queue holds at most `depth` batches (default 1), so a task holds at most about five batches of
samples at once (one being read, one queued, one in fn, one queued for writing, one being written),
whatever the shard size. An exception in a thread is re-raised in the task's thread, at the next
hand-off; stopping (an error, Ctrl-C) ends both threads at their next item.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from typing import Any, Callable, Iterable, Iterator

_END = object()
ENABLED = os.environ.get("SHARDFLOW_BATCH_OVERLAP", "1") != "0"  # 0: no threads (to measure what they give)
_POLL_S = 0.1  # how often a blocked hand-off looks whether the other side stopped
_JOIN_S = 30.0  # how long stopping waits for a thread busy in one item (a read, a write)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class ReadAhead:
    """Iterate `source` in a background thread, at most `depth` items ahead of the consumer."""

    def __init__(self, source: Iterable[Any], depth: int = 1, name: str = "shardflow-read") -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        # the task's context variables (its split-key state: task/split_keys) hold in the thread too
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run, source), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, source: Iterable[Any]) -> None:
        try:
            for item in source:
                if not _put(self._queue, item, self._stop):
                    return
            _put(self._queue, _END, self._stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            _put(self._queue, _Failed(exc), self._stop)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        """Stop the thread (it may be inside one read) and wait for it, so the input can be closed."""
        self._stop.set()
        _empty(self._queue)
        self._thread.join(_JOIN_S)


class Sink:
    """Hand items to `consume` in a background thread, in order, at most `depth` queued."""

    def __init__(self, consume: Callable[[Any], None], depth: int = 1, name: str = "shardflow-write") -> None:
        self._consume = consume
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                return
            try:
                self._consume(item)
            except BaseException as exc:  # noqa: BLE001 - raised in the task's thread
                self._error = exc
                self._stop.set()
                return

    def put(self, item: Any) -> None:
        """Queue an item (blocks while the queue is full); raises what the thread raised so far."""
        self._raise()
        _put(self._queue, item, self._stop)
        self._raise()

    def finish(self) -> None:
        """Wait until every queued item is consumed; raises what the thread raised."""
        _put(self._queue, _END, self._stop)
        self._thread.join()
        self._raise()

    def close(self) -> None:
        """Stop without consuming what is left (the task failed or was interrupted)."""
        self._stop.set()
        _empty(self._queue)
        self._thread.join(_JOIN_S)

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _put(target: "queue.Queue[Any]", item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            target.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _empty(target: "queue.Queue[Any]") -> None:
    while True:
        try:
            target.get_nowait()
        except queue.Empty:
            return


class Inline:
    """ReadAhead and Sink without threads (SHARDFLOW_BATCH_OVERLAP=0): the stages run one after another."""

    def __init__(self, source: Iterable[Any] = (), consume: Callable[[Any], None] | None = None) -> None:
        self._source, self._consume = source, consume

    def __iter__(self) -> Iterator[Any]:
        return iter(self._source)

    def put(self, item: Any) -> None:
        assert self._consume is not None
        self._consume(item)

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


def read_ahead(source: Iterable[Any]) -> ReadAhead | Inline:
    return ReadAhead(source) if ENABLED else Inline(source)


def sink(consume: Callable[[Any], None]) -> Sink | Inline:
    return Sink(consume) if ENABLED else Inline(consume=consume)
