"""The hash a shard's receipt carries: sha256 (the default), or a faster one chosen by name.

sha256 runs at ~0.5 GB/s a core (~1.7 GB per CPU-second here): on a copy of 60 KB samples it is the
floor of the whole job. BLAKE3 (~4 GB/s, the `blake3` package) and XXH3-128 (~20 GB/s, `xxhash`, not
cryptographic: it detects damage, not tampering) cost a fraction of that. The receipt names its hash
(ShardInfo.checksum; in JSON the digest sits under that name), so a reader never mistakes one for
another. A chosen hash whose package is missing is an error naming the extra, never a silent sha256.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

CHECKSUMS = ("sha256", "blake3", "xxh3_128")
DEFAULT = "sha256"
EXTRA = "checksums"  # pip install 'shardflow[checksums]' brings blake3 and xxhash


class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


class MissingChecksum(ImportError):
    """The chosen receipt hash's package cannot be imported here."""


def check_checksum(name: Any) -> str:
    """`name` when it is a known receipt hash whose package imports here, else an error saying why."""
    if name not in CHECKSUMS:
        raise ValueError(f"checksum must be one of {', '.join(map(repr, CHECKSUMS))}, not {name!r}")
    new_hasher(name)
    return name


def new_hasher(name: str) -> Hasher:
    """A fresh hash object for `name` (see CHECKSUMS)."""
    if name == "sha256":
        return hashlib.sha256()
    package = {"blake3": "blake3", "xxh3_128": "xxhash"}.get(name)
    if package is None:
        raise ValueError(f"checksum must be one of {', '.join(map(repr, CHECKSUMS))}, not {name!r}")
    try:
        module = __import__(package)
    except ImportError as exc:
        raise MissingChecksum(
            f"checksum={name!r} needs the {package!r} package, which cannot be imported here ({exc}): "
            f"pip install 'shardflow[{EXTRA}]' (or {package}), or use checksum='sha256'") from exc
    if name == "blake3":
        return module.blake3(max_threads=1)  # the sink's hashing thread is the one thread it gets
    return module.xxh3_128()
