"""What sample grouping does next to archive damage: deliver a sample only when it is provably
whole, never a partial sample as if it were good.

Nothing in a damaged region can be trusted (tar_recover), so its members' names are unknown. Hence:

- the sample in progress when damage is found is left out: its last members may be in the region,
  and the size of its last member may be the lie that caused the damage;
- the first sample after the damage is left out: its first members may be in the region;
- when the first member after the damage has a name that could be a stand-in (a ustar name of 99+
  bytes, '@LongName', '?' from a lossy encoding: what writers put in the header when a pax or GNU
  long name record carries the real one, and that record may be what was lost), the sample after
  it is left out too, as that member may really belong to it.

Every sample left out is reported with its key; the damaged region itself is reported with the
offsets it spans (samples wholly inside it cannot be named). A Corruption with a `key` (one member
lost, its header sound) leaves out that key's sample only. The keys of sound headers found out of
place in a damaged region (`Corruption.suspects`: a header displaced there, a member swallowed by a
size that lies) lost a member to it: a sample of such a key met anywhere later is left out too.
"""

from __future__ import annotations

from typing import Callable

from shardflow.errors import FormatError, SampleError, ShardflowError
from shardflow.shards.keys import Sample
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_read import Member
from shardflow.shards.tar_recover import Corruption

_STAND_IN_LENGTH = 99  # a ustar name this long may be the first 100 bytes of a longer real name


class DamageGuard:
    """The damage state of one shard being grouped into samples, and the decisions it leads to.

    iter_samples hands it every Corruption and, after damage, every member until the samples next
    to the damage are behind; it reports (through `problem`) each sample it leaves out.
    """

    def __init__(self, url: str, problem: Callable[[ShardflowError], None]) -> None:
        self._url = url
        self._problem = problem
        self._suspect: str | None = None  # key of the sample being left out after damage
        self._budget = 0  # how many more new keys after the first one after damage are left out
        self._first = False  # the next member is the first after the damage
        self._displaced: dict[str, int | None] = {}  # suspect key -> offset of the damage that named it
        self.active = False  # samples next to damage are still being left out

    def damaged(self, damage: Corruption, current: Sample | None, seen: dict[str, int]) -> str | None:
        """Report damage found while `current` was in progress (it is left out); returns the key whose
        members are to be skipped from now on (the current sample's), if any. `seen`: the keys met
        so far (a suspect among them was delivered before the damage showed it incomplete)."""
        self._problem(damage.error)
        key = None if current is None else current["__key__"]
        for suspect in damage.suspects:  # named by a sound header in the region: a member of it is lost
            if suspect not in self._displaced and suspect != key:
                self._suspect_reported(suspect, damage.error.offset, seen.get(suspect))
            self._displaced.setdefault(suspect, damage.error.offset)
        if damage.key is not None:  # one member lost, framing sound: only its sample is affected
            if key is not None and key != damage.key:
                return None  # the caller finishes `current` normally
            self._left_out(damage.key, damage.error.offset, "a member of it could not be read")
            return damage.key
        if key is not None:
            self._left_out(key, damage.error.offset, "archive damage follows it, its last members may be lost")
        self._suspect, self._first, self.active = key, True, True
        return key

    def leave_out(self, member: Member, key: str) -> bool:
        """After damage: whether `member` (of `key`) belongs to a sample that is left out."""
        if self._first:  # the first member after the damage: its sample is left out
            self._first = False
            self._budget = 1 if _could_be_stand_in(member.name) else 0
            if key != self._suspect:
                self._left_out(key, member.offset, "it follows archive damage, its first members may be lost")
            self._suspect = key
            return True
        if key == self._suspect:
            return True
        if self._budget == 0:
            self.active, self._suspect = False, None
            return False
        self._budget -= 1
        self._suspect = key
        self._left_out(key, member.offset, "a member before it has a name that may stand in for a longer one lost "
                                           "with archive damage (it may be this sample's)")
        return True

    def displaced(self, key: str) -> bool:
        """Whether a new sample of `key` lost a member to earlier damage, which found a header of that
        key out of place: then it is left out (it was reported with that damage)."""
        return bool(self._displaced) and key in self._displaced  # reported when the damage was

    def orphan(self, member: Member, current: Sample | None, held: Sample | None) -> bool:
        """A member with no extension whose name may be a writer's stand-in (see _could_be_stand_in):
        its pax or long-name record, which held the real name, was lost or moved (two blocks swapped).
        The member may belong to the sample in progress, to the one before it when that one is still
        held back (the record's place may hold another sample's header), or to the next one: all are
        left out."""
        name = member.name  # a plain non-ASCII name is no sign here: the GNU format holds those as they are
        if not (len(name) >= _STAND_IN_LENGTH or name == "@LongName" or "?" in name):
            return False
        why = "a member next to it has a name that stands in for one lost with its pax or long-name record"
        end = member.offset + BLOCK + len(member.data) + (-len(member.data) % BLOCK)
        self._problem(FormatError(f"damaged up to offset {end} (reading resumed there): member {name!r} has a name "
                                  "that stands in for a longer one lost with its pax or long-name record: the sample "
                                  "it belongs to is unknown", url=self._url, offset=member.offset))
        for sample in (held, current):
            if sample is not None:
                self._left_out(sample["__key__"], member.offset, why + " (it may be this sample's)")
        self.active, self._first, self._suspect, self._budget = True, False, None, 1
        return True

    def _suspect_reported(self, key: str, offset: int | None, met: int | None) -> None:
        if met is None:
            self._left_out(key, offset, "a sound header of it is in the damaged region (displaced there, or its "
                                        "size lies): a member of it is lost (the rest is left out)")
            return
        self._problem(SampleError(f"sample met before (offset {met}) is incomplete: a sound header of it is in the "
                                  "damaged region (a sample delivered under this key lacks a member)",
                                  url=self._url, key=key, offset=offset))

    def renamed(self, key: str, current: Sample, offset: int) -> bool:
        """Whether a new `key` next to the sample in progress is that sample's key with '?' for its
        non-ASCII characters (or the reverse): what tarfile writes in the ustar header in place of a
        name its pax record holds, so a member whose record was lost (moved by damage). Both samples
        are left out (reported here)."""
        other = current["__key__"]
        if len(key) != len(other) or ("?" not in key and "?" not in other):
            return False
        if not all(a == b or (a == "?" and not b.isascii()) or (b == "?" and not a.isascii())
                   for a, b in zip(key, other)):
            return False
        why = (f"key {key!r} next to key {other!r} is what tarfile writes in place of a non-ASCII name when its pax "
               "record is lost: a member of one sample is under the wrong key")
        self._left_out(other, offset, why)
        self._left_out(key, offset, why)
        return True

    def held_back(self, sample: Sample, offset: int | None) -> None:
        """Report `sample`, held back while the first member of the next one was checked, as left out:
        damage followed that member, whose header may be a displaced one standing in place of one of
        this sample's members (two headers swapped)."""
        self._left_out(sample["__key__"], offset, "damage follows the first member of the next sample, whose header "
                                                  "may stand where a member of this one was")

    def _left_out(self, key: str, offset: int | None, why: str) -> None:
        self._problem(SampleError(f"sample left out: {why}", url=self._url, key=key, offset=offset))


def _could_be_stand_in(name: str) -> bool:
    """Whether a header name may stand in for a longer one held by a (lost) pax or GNU record."""
    return len(name) >= _STAND_IN_LENGTH or not name.isascii() or "?" in name or name == "@LongName"
