"""FileValue: a member value whose bytes are a local file's, streamed into a shard instead of held in RAM.

A `shardflow map` command may leave a file of hundreds of MB; reading it whole would cost its size in
memory per sample in flight. shell_files hands such a file on as a FileValue instead: the descriptor
it opened (O_NOFOLLOW, checked with fstat) and the size it saw. The encoder passes it on untouched,
like bytes, and the tar writer copies it in chunks through the same sink as every other byte, so
the receipt's hash covers exactly the bytes written and the archive is the one bytes would give.

The descriptor is what keeps the data: the file may be unlinked (its private directory removed)
before the writer gets to it, possibly on another thread. Reads use pread (no shared offset), so the
value can be read more than once; the descriptor is closed when the value is garbage-collected or
close() is called. A file that no longer holds `size` bytes when it is read raises OSError: the tar
header already promised that size, so the shard is aborted rather than written short.

Anything that needs the whole value (a record-stream shard, pickling) gets bytes(value).
"""

from __future__ import annotations

import os
from typing import Iterator

CHUNK = 1 << 20  # bytes read at a time when streamed


class FileValue:
    """`size` bytes of the open file `fd` (owned: closed by close() or when collected); `name` for messages."""

    __slots__ = ("fd", "size", "name")

    def __init__(self, fd: int, size: int, name: str = "") -> None:
        self.fd = fd
        self.size = size
        self.name = name

    def __len__(self) -> int:
        return self.size

    def chunks(self, chunk: int = CHUNK) -> Iterator[bytes]:
        """The file's bytes in pieces of at most `chunk`, exactly `size` in all (else OSError)."""
        if self.fd < 0:
            raise OSError(f"{self.name or 'file value'} is closed")
        offset = 0
        while offset < self.size:
            piece = os.pread(self.fd, min(chunk, self.size - offset), offset)
            if not piece:
                raise OSError(f"{self.name or 'file value'} shrank to {offset} of its {self.size} bytes while "
                              "it was written")
            offset += len(piece)
            yield piece

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks())

    def __reduce__(self) -> tuple[type, tuple[bytes]]:
        return bytes, (bytes(self),)  # a pickled value is its bytes: a descriptor means nothing elsewhere

    def __repr__(self) -> str:
        return f"FileValue({self.name!r}, {self.size} bytes)"

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()
