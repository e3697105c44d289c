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
lost, its header sound) leaves out that key's sample only.
"""

from __future__ import annotations

from typing import Callable

from shardflow.errors import SampleError, ShardflowError
from shardflow.shards.keys import Sample
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
        self.active = False  # samples next to damage are still being left out

    def damaged(self, damage: Corruption, current: Sample | None) -> str | None:
        """Report damage found while `current` was in progress (it is left out); returns the key whose
        members are to be skipped from now on (the current sample's), if any."""
        self._problem(damage.error)
        key = None if current is None else current["__key__"]
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
        self._left_out(key, member.offset, "the member before it follows archive damage under a name that may "
                                           "stand in for a longer one lost with the damage (it may be this sample's)")
        return True

    def _left_out(self, key: str, offset: int | None, why: str) -> None:
        self._problem(SampleError(f"sample left out: {why}", url=self._url, key=key, offset=offset))


def _could_be_stand_in(name: str) -> bool:
    """Whether a header name may stand in for a longer one held by a (lost) pax or GNU record."""
    return len(name) >= _STAND_IN_LENGTH or not name.isascii() or "?" in name or name == "@LongName"
