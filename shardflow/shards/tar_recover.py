"""What the tar reader does at damage: raise it, or (`iter_members(..., resync=True)`) report it as
one `Corruption` and read on at the next block that is a valid header.

Kept apart from the plain reading path so every rule about damage lives here. The rules:

- Nothing of a damaged header is trusted: not its size (a size that happens to land on a valid
  header skipped whole samples unreported), not its name (it named the wrong sample). After a bad
  header the stream is scanned block by block to the next header whose checksum is right.
- The end of an archive is two zero blocks. A lone zero block followed by more data is damage (GNU
  tar warns "A lone zero block"); one zero block and then the end of the stream is a cut-short end
  (reported: the last member may have lost a block, and so be read with the marker's zeros).
  After the end marker the stream is read on (a compressed one to its end, where its checksum is
  checked; a plain one for at most 1 MiB): zeros are padding; a valid header there is damage (a
  zeroed header of a member whose data is zeros looks just like it; concatenated archives too:
  they must be read one by one); other bytes are ignored with a warning.
- A Corruption says where the damaged region starts (`error.offset`) and where reading resumed
  (`end`), so the samples it may have hidden can be accounted for; `key` is set only when the
  damage is confined to one member whose header was sound (a sparse member that cannot be rebuilt):
  then only that member's sample is affected.
- A damaged region may hold headers whose checksum is right but whose place is wrong (a header
  displaced by two blocks that traded places, a size that lies, a pax record not followed by its
  member): their names are the only ones in the region that can be trusted, as names. They go out
  as `suspects`: keys of samples that lost (or may have lost) a member to the damage wherever they
  show up later in the shard (sample_recover leaves those samples out).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Generator

from shardflow.errors import FormatError, ShardflowWarning
from shardflow.shards.tar_blocks import Blocks
from shardflow.shards.tar_headers import BLOCK, ZERO_BLOCK, checksum_ok, truncated_header
from shardflow.text import redact_userinfo, safe

_AFTER_END = 1 << 20  # how far past the end marker a plain stream is read (looking for damage)



@dataclass(slots=True)
class Corruption:
    """Yielded instead of raising when `resync=True`: the archive is damaged from `error.offset`.

    `end`: the offset where reading resumed (None when the stream ended inside the damage).
    `key`: set when only the member with this key was lost (its header was sound); else the damage
    may have hidden any number of members, whose names are unknown but for `suspects`: the keys of
    sound headers found out of place in the region (a sample of such a key met later lacks a member).
    """

    error: FormatError
    end: int | None = None
    key: str | None = None
    suspects: tuple[str, ...] = ()


class Resync:
    """The damage policy of one archive being read: raise (resync=False) or report and read on."""

    def __init__(self, blocks: Blocks, url: str, resync: bool) -> None:
        self._blocks = blocks
        self._url = url
        self.resync = resync
        self.hit = False  # damage was skipped: reading went on after a damaged region

    def member_lost(self, error: FormatError, key: str) -> Generator[Corruption, None, None]:
        """A member read whole but unusable (its header was sound): raise, or report its key."""
        if not self.resync:
            raise error
        yield Corruption(error.with_location(key=key), self._blocks.offset, key)  # type: ignore[arg-type]

    def skip(self, error: FormatError, suspects: tuple[str, ...] = ()) -> Generator[Corruption, None, bool]:
        """Damage at `error.offset`: raise it, or read on to the next valid header (left to be read
        next) and report the region once (with the `suspects` keys, see Corruption). False when the
        stream ended there after zero blocks (a clean end); a stream that ends otherwise inside the
        damage raises the truncation."""
        if not self.resync:
            raise error
        blocks = self._blocks
        zeros = False  # the last block read was all zeros
        while True:
            offset = blocks.offset
            header = blocks.take(BLOCK)
            if len(header) < BLOCK:
                yield Corruption(_region(error, None), suspects=suspects)
                if zeros and not header:
                    blocks.check()
                    return False
                raise blocks.cut(truncated_header(header, offset, self._url))
            if header == ZERO_BLOCK:
                zeros = True
                continue
            zeros = False
            if checksum_ok(header):
                blocks.push_back(header)
                self.hit = True
                yield Corruption(_region(error, offset), offset, suspects=suspects)
                return True

    def zero_block(self, offset: int) -> Generator[Corruption, None, bool]:
        """A zero block where a header belongs (at `offset`, already read): the end, or damage.
        True when reading goes on (at the next valid header), False at the end of the archive (the
        end marker cut short is reported first: the sample in progress is not known whole)."""
        blocks = self._blocks
        second = blocks.take(BLOCK)
        if second == ZERO_BLOCK:
            return (yield from self._after_end(offset))
        if len(second) < BLOCK:  # a lost block of the last member's data can look just like this
            blocks.check()
            error = FormatError("truncated tar: the end-of-archive marker is cut short (one zero block, it is two)",
                                url=self._url, offset=offset)
            if not self.resync:
                raise error
            yield Corruption(_region(error, None))
            return False
        blocks.push_back(second)
        error = FormatError("a lone zero block where a header belongs, followed by more data (the end of an "
                            "archive is two zero blocks): a damaged or zeroed header", url=self._url, offset=offset)
        return (yield from self.skip(error))

    def _after_end(self, marker: int) -> Generator[Corruption, None, bool]:
        """After the end-of-archive marker at `marker`: read the rest of the stream (bounded memory)."""
        blocks = self._blocks
        junk = 0
        # A compressed stream is read to its end (its checksum is checked there); a plain one at most
        # _AFTER_END bytes further (a pipe may never end).
        stop = None if blocks.compression else blocks.offset + _AFTER_END
        while stop is None or blocks.offset < stop:
            offset = blocks.offset
            block = blocks.take(BLOCK)
            if not block:
                break
            if block.count(0) == len(block):  # zeros: padding
                continue
            if len(block) == BLOCK and checksum_ok(block):
                blocks.push_back(block)
                error = FormatError(f"end-of-archive marker followed by more tar members at offset {offset} (a "
                                    "zeroed header, or archives concatenated: read them one by one)",
                                    url=self._url, offset=marker)
                return (yield from self.skip(error))
            junk += len(block)
        blocks.check()
        if junk:
            shard = safe(redact_userinfo(self._url))  # a name from data: escaped, as errors are
            warnings.warn(f"shard {shard}: {junk} bytes of data after the end-of-archive marker (offset "
                          f"{marker}) ignored", ShardflowWarning, stacklevel=4)
        return False


def _region(error: FormatError, end: int | None) -> FormatError:
    """The damage's error, saying first (messages may be cut short) where reading resumed, so the
    region's extent is known, or that the stream ended inside it."""
    head = f"damaged up to offset {end} (reading resumed there)" if end is not None else (
        "damaged up to the end of the stream")
    return FormatError(f"{head}: {error.reason}", url=error.url, key=error.key, offset=error.offset)
