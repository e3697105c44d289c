"""The deflate engine of the fast PNG writer (`images.encode_png_fast`): which library makes the zlib
stream of the IDAT chunk.

Any valid zlib stream makes a valid PNG, but each engine writes other bytes for the same pixels, and
shardflow promises the same output bytes on every worker and every rerun. So the engine is an explicit
encode option (`png_deflate`), never chosen by what happens to be importable: a chosen engine that is
missing is an error, not a silent fallback to another one.

- ``"isal"`` (the default): ISA-L's deflate (the ``isal`` package, a dependency of shardflow) at its
  level 1. On a noisy 512x384 RGB image 10-15x faster than zlib level 1, and no larger; PNG encoding
  was 60 % of the augment job's time with zlib. The bytes follow the isal version (pinned in
  constraints.txt): workers of one run need the same one.
- ``"zlib"``: the standard library's zlib, what shardflow wrote before the option existed (Encoders
  pickled then, in run directories, keep it: see `images.ImageOptions.__setstate__`).

Level 0 stores the rows uncompressed (zlib's stored blocks) whatever the engine: it is what level 0
means, and it is faster than any compression.

Levels 2-9 are not an engine's choice: they deflate as Pillow's PNG encoder does (`deflate_like_pillow`),
so that the writer makes Pillow's bytes there.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Callable

PNG_DEFLATE_ENGINES = ("isal", "zlib")


class MissingDeflateEngine(ImportError):
    """The chosen PNG deflate engine cannot be imported here; never replaced by another engine."""


@functools.lru_cache(maxsize=None)
def _isal_compress() -> Callable[[Any, int], bytes]:
    try:
        from isal import isal_zlib
    except ImportError as e:
        raise MissingDeflateEngine(
            "png_deflate='isal' needs the 'isal' package (python-isal, a dependency of shardflow), which "
            f"cannot be imported here ({e}): install it (pip install isal), or choose png_deflate='zlib' "
            "(other PNG bytes, several times slower); shardflow never switches engines by itself, so that "
            "every worker writes the same bytes"
        ) from e
    return isal_zlib.compress


def check_engine(engine: Any, level: int) -> None:
    """Refuse an unknown engine, or a missing one that PNG compress `level` would use (only level 1
    deflates through the engine: 0 stores, 2-9 are Pillow's), when the options are made on the driver,
    not on the first image of a task."""
    if engine not in PNG_DEFLATE_ENGINES:
        raise ValueError(f"png_deflate must be one of {', '.join(map(repr, PNG_DEFLATE_ENGINES))}, got {engine!r}")
    if engine == "isal" and level == 1:
        _isal_compress()


def deflate(data: Any, level: int, engine: str) -> bytes:
    """The zlib stream of ``data`` (any buffer) at ``level`` (0 or 1) by ``engine``."""
    if level == 0 or engine == "zlib":
        return zlib.compress(data, level)
    return _isal_compress()(data, level)


# What Pillow's PNG encoder asks of zlib: a 32 KiB window, memory level 9, and the strategy for filtered
# image rows.
_PILLOW_WINDOW_BITS, _PILLOW_MEMORY_LEVEL, _PILLOW_STRATEGY = 15, 9, zlib.Z_FILTERED


def deflate_like_pillow(data: Any, level: int) -> bytes:
    """The zlib stream of ``data`` (filtered PNG rows, any buffer) at ``level`` with the settings Pillow's
    PNG encoder uses, in one call: the same stream as Pillow's row-by-row calls when both use the same
    zlib. CPython's zlib releases the GIL while it compresses, so an encode thread runs beside the task's."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, _PILLOW_WINDOW_BITS, _PILLOW_MEMORY_LEVEL, _PILLOW_STRATEGY)
    return compressor.compress(data) + compressor.flush()
