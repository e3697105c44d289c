"""The byte pipeline under a tar writer: count, hash and write, optionally in background threads,
with a bound on the bytes in flight. Kept apart from the writer because its threading is the one
delicate part of writing a shard."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from shardflow.shards.checksums import new_hasher

_INLINE_BELOW = 256 << 10  # a shard's bytes up to here are hashed and written in the caller


class HashingSink:
    """Counts and hashes what passes through to the output, so receipts cost no second read.

    With `threaded=True` (what TarWriter uses) the hashing and the writing each happen in a
    background thread, in order, while the caller goes on reading, parsing and encoding: sha256
    and the write system calls release the GIL, so with a spare core they cost little wall time.
    At most `max_inflight` bytes wait for those threads when write_parts() returns (a larger batch is
    waited for), so memory stays bounded; `settle()` waits for all of them. The threads let go of a
    batch before they count it done, so a large sample settled is freed as soon as the caller drops
    it (a 10 MB sample left in flight while the reader built the next two kept three in memory). An
    error in the writing thread is raised by the next write() or drain().
    """

    def __init__(self, out: Any, hash_name: str | None, *, threaded: bool = False,
                 max_inflight: int = 8 << 20) -> None:
        self._out = out
        self.checksum = hash_name or ""  # the receipt's hash (shards.checksums), "" for none
        self._hash = new_hasher(hash_name) if hash_name else None
        self.nbytes = 0
        self._threaded = threaded
        self._threads: list[threading.Thread] = []
        self._max_inflight = max_inflight
        self._inflight = 0
        self._cond = threading.Condition()
        self._queues: list[deque] = []
        self._error: BaseException | None = None
        self._discard = False

    def write(self, data: bytes) -> int:
        self.write_parts([data])
        return len(data)

    def write_parts(self, parts: list[bytes]) -> None:
        """Hash and write `parts` in order (TarStreamWriter hands its batches here)."""
        size = 0
        for part in parts:
            size += len(part)
        self.nbytes += size
        if not self._threaded or (not self._threads and self.nbytes < _INLINE_BELOW):
            # the first 256 KiB, while no thread runs: a tiny shard (one batch, at its end) is hashed
            # and written here without starting two threads for it (~0.3 ms of CPU a shard)
            if self._hash is not None:
                self._digest(parts)
            self._write(parts)
            return
        if not self._threads:
            self._start()
        cond = self._cond
        with cond:
            while self._inflight and self._inflight + size > self._max_inflight and self._error is None:
                cond.wait()
            if self._error is not None:
                raise self._error
            self._inflight += size
            item = [parts, size, len(self._queues)]  # released when every consumer is done with it
            for queue in self._queues:
                queue.append(item)
            cond.notify_all()
            while self._inflight > self._max_inflight and self._error is None:  # a batch over the bound
                cond.wait()

    def settle(self) -> None:
        """Wait until every batch handed over so far was hashed and written (the threads go on), so
        the caller can drop it and have it freed: TarWriter does after a sample with a large member,
        before the next sample is read."""
        if self._threads:
            with self._cond:
                while self._inflight and self._error is None:
                    self._cond.wait()

    def _digest(self, parts: list[bytes]) -> None:
        update = self._hash.update  # type: ignore[union-attr]
        for part in parts:
            update(part)

    def _write(self, parts: list[bytes]) -> None:
        if self._error is None and not self._discard:
            write_parts = getattr(self._out, "write_parts", None)
            if write_parts is not None:  # a local file: one vectored write for the batch
                write_parts(parts)
                return
            write = self._out.write
            for part in parts:
                write(part)

    def _start(self) -> None:
        consumers = [self._write] + ([self._digest] if self._hash is not None else [])
        for consume in consumers:
            queue: deque = deque()
            self._queues.append(queue)
            thread = threading.Thread(target=self._run, args=(queue, consume), daemon=True,
                                      name="shardflow-shard-" + consume.__name__.strip("_"))
            self._threads.append(thread)
            thread.start()

    def _run(self, queue: deque, consume: Callable[[list[bytes]], None]) -> None:
        cond = self._cond
        while True:
            with cond:
                while not queue:
                    cond.wait()
                item = queue.popleft()
            if item is None:
                return
            try:
                consume(item[0])
            except BaseException as exc:  # noqa: BLE001 - handed to the writing thread
                if self._error is None:
                    self._error = exc
            finally:
                with cond:
                    item[2] -= 1
                    if item[2] == 0:
                        item[0] = None  # let go of the batch before it counts as done (see the class)
                        self._inflight -= item[1]
                        cond.notify_all()
                item = None  # not held until the next batch comes

    def drain(self, discard: bool = False) -> None:
        """Wait until every batch was hashed and written (or dropped, with discard=True); raise
        the background threads' error, if any (not when discarding)."""
        threads, self._threads = self._threads, []
        if threads:
            with self._cond:
                self._discard = self._discard or discard
                for queue in self._queues:
                    queue.append(None)
                self._cond.notify_all()
            for thread in threads:
                thread.join()
            self._queues = []
        if self._error is not None and not discard:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        self.drain()
        flush = getattr(self._out, "flush", None)
        if flush is not None:
            flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else ""
