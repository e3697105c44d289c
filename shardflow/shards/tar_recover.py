"""Reading on past damage in a tar archive (`iter_members(..., resync=True)`).

Kept apart from the plain reading path: tar_read calls a `Resync` only when a header is bad, so a
sound archive never runs this code, and every rule about damage lives here. A damaged header is
reported as one `Corruption`, then reading resumes at the next block that is a valid header.
Whether the lost member can be named (so that sample grouping knows which sample it cut) is decided
by `Resync.bad_header`: only when the damaged header's size field leads exactly to a valid header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

from shardflow.errors import FormatError
from shardflow.shards.keys import split_name
from shardflow.shards.tar_blocks import Blocks
from shardflow.shards.tar_headers import (
    BLOCK,
    REGULAR,
    ZERO_BLOCK,
    checksum_ok,
    clean_name,
    cstring,
    member_name,
    parse_number,
    pax_records,
    truncated_header,
)

# A damaged header whose size field says at most this much is checked by reading that far to see
# whether a valid header follows (then exactly one entry is lost and its name is known).
_TRIAL_LIMIT = 64 << 20

# (long name, pax records) that describe the next member, as the reading loop carries them
Carried = tuple[str | None, dict[str, str]]


@dataclass(slots=True)
class Corruption:
    """Yielded instead of raising when `resync=True`: the archive was damaged at `error.offset`.

    `hint` is the name of the member the damaged header described, when that can be told reliably
    (the damaged header's size field leads exactly to a valid header, and its name is clean text);
    None when the damage is too wide to tell. A member whose own header is damaged is never yielded;
    when a damaged pax/GNU long-name header precedes a member, that member is yielded after the
    Corruption (under the recovered name, which is also the hint) so the reader can leave its sample
    out.
    """

    error: FormatError
    hint: str | None = None


def _corruption(error: FormatError, hint: str | None) -> Corruption:
    """A Corruption whose error also names the damaged member's key when it is known."""
    return Corruption(error if hint is None else error.with_location(key=split_name(hint)[0]), hint)


class Resync:
    """The damage state of one archive being read with resync=True.

    `pending` is set while a damaged pax/long-name header was skipped whose member comes next: that
    member's Corruption is released (named after it) when the member is read.
    """

    def __init__(self, blocks: Blocks, url: str) -> None:
        self._blocks = blocks
        self._url = url
        self.pending: FormatError | None = None

    def release_pending(self, name: str | None) -> Corruption:
        """The Corruption of the damaged metadata, naming the member it described when known."""
        error, self.pending = self.pending, None
        assert error is not None
        return _corruption(error, None if name is None else clean_name(name))

    def bad_header(
        self, error: FormatError, header: bytes, offset: int, long_name: str | None, pax: dict[str, str]
    ) -> Generator[Corruption, None, Carried | None]:
        """After a header with a bad checksum: report it and position the stream after the damage.

        Returns the (long name, pax) the next header is read with, or None when the stream ended
        cleanly inside the damage.
        """
        if self.pending is not None:
            yield self.release_pending(None)
        bound = self._try_bound(header, offset, long_name, pax)
        if bound is None:
            more = yield from self.skip_damage(error)
            return (None, {}) if more else None
        hint, long_name, pax = bound
        if hint is None and (long_name is not None or pax):
            self.pending = error  # the member this metadata describes comes next
            return long_name, pax
        yield _corruption(error, hint)
        return None, {}

    def skip_damage(self, error: FormatError) -> Generator[Corruption, None, bool]:
        """Read on to the next block that is a valid header (left to be read next), reporting the
        damaged region once; False when the stream ended there after zero blocks (a clean end).

        A stream that ends otherwise inside the damage raises the truncation, after the report.
        """
        blocks = self._blocks
        zeros = False  # the last block read was all zeros
        while True:
            offset = blocks.offset
            header = blocks.take(BLOCK)
            if len(header) < BLOCK:
                yield Corruption(error)
                if zeros and not header:
                    return False  # the stream is at its end: a gzip stream was checked by reading it
                raise truncated_header(header, offset, self._url)
            if header == ZERO_BLOCK:
                zeros = True
                continue
            zeros = False
            if checksum_ok(header):
                blocks.push_back(header)
                yield Corruption(error)
                return True

    def _try_bound(
        self, header: bytes, offset: int, long_name: str | None, pax: dict[str, str]
    ) -> tuple[str | None, str | None, dict[str, str]] | None:
        """Does the damaged header's size field lead exactly to a valid header?

        If so, skip that one entry and return (hint, long_name, pax): for a regular member the hint
        is its name; for a pax/long-name header its records are taken so the next member gets its
        real name. Otherwise put back what was read and return None.
        """
        typeflag = header[156:157]
        if typeflag not in (*REGULAR, b"L", b"x"):
            return None
        try:
            size = parse_number(header[124:136])
        except ValueError:
            return None
        if not 0 <= size <= _TRIAL_LIMIT:
            return None
        blocks = self._blocks
        padded = size + (-size % BLOCK)
        body = blocks.read(padded)
        after = blocks.read(BLOCK)
        if len(body) != padded or len(after) != BLOCK or not (after == ZERO_BLOCK or checksum_ok(after)):
            blocks.push_back(body + after)
            return None
        blocks.push_back(after)
        if typeflag == b"L":
            name = clean_name(cstring(body[:size]).decode("utf-8", "surrogateescape"))
            if name is None:
                blocks.push_back(body)
                return None
            return None, name, {}
        if typeflag == b"x":
            try:
                records = pax_records(body[:size], self._url, offset)
            except FormatError:
                blocks.push_back(body)
                return None
            return None, None, records
        return clean_name(member_name(header, long_name, pax)), None, {}
