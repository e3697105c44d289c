"""ShardInfo, the receipt of a committed shard (tar or record stream), and OneShard, the close/abort
protocol every single-shard writer shares: apart from the writers so that each kind can use them
without importing the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from shardflow.errors import ShardIOError


@dataclass(frozen=True)
class ShardInfo:
    """Receipt of a committed shard. `sha256` holds the hex digest by `checksum`: sha256 unless the
    writer was given another (shards.checksums); in JSON the digest sits under the checksum's name,
    so a receipt of the default is `{"url", "nsamples", "nbytes", "sha256"}` as it always was."""

    url: str
    nsamples: int
    nbytes: int
    sha256: str
    checksum: str = "sha256"

    def to_json(self) -> dict[str, Any]:
        """Its fields by name, the digest under the checksum's name (spelled out: dataclasses.asdict
        deep-copies field by field, ~10 us of every task's marker)."""
        return {"url": self.url, "nsamples": self.nsamples, "nbytes": self.nbytes,
                self.checksum or "checksum": self.sha256}

    @property
    def digest(self) -> str:
        """The hex digest, whatever the checksum (`checksum` names it)."""
        return self.sha256


class OneShard:
    """`with` and garbage collection for a writer of one shard (it defines `closed`, close(), abort()).

    A clean `with` block commits (close); an exception aborts; a writer dropped without either is
    aborted, so a half-written shard never appears under its name.
    """

    closed: bool
    url: str
    nsamples: int
    _atomic: Any  # the AtomicOutput the writer owns (a URL it was given), or None (a stream)
    _sink: Any  # the HashingSink every byte went through

    def _close_after(self, finish: Callable[[], None]) -> ShardInfo:
        """close() for every writer: `finish` writes and drains the last bytes, then the shard is
        committed; any failure aborts it (nothing appears under its name), an OSError as a
        ShardIOError naming the shard."""
        if self.closed:
            raise ValueError(f"{self.url} is already closed")
        try:
            finish()
        except BaseException as exc:
            self.closed = False  # `finish` may have marked it closed (a stream it closed): abort anyway
            self.abort()
            if isinstance(exc, OSError):
                raise ShardIOError(f"write failed: {exc}", url=self.url) from exc
            raise
        return self._commit()

    def _commit(self) -> ShardInfo:
        """After every byte was written: closed, published under its name (when the writer owns the
        output), and the receipt (count, size, digest from the sink)."""
        self.closed = True
        if self._atomic is not None:
            self._atomic.commit()  # aborts and raises ShardIOError itself when it fails
        return ShardInfo(self.url, self.nsamples, self._sink.nbytes, self._sink.hexdigest(),
                         self._sink.checksum or "sha256")

    def close(self) -> ShardInfo:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        # dropped without close() or abort(): stop the writing thread so the output can be aborted
        if not getattr(self, "closed", True):
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - never raise from a finaliser
                pass

    def __enter__(self):  # noqa: ANN204 - the subclass itself
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self.closed:
                self.close()
        else:
            self.abort()
