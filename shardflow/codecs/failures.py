"""How a codec failure is put into words: the same failure must give the same reason (no object
addresses), so run statistics can count reasons across samples and workers."""

from __future__ import annotations

import re
from typing import Any


class Refused(Exception):
    """A decode we will not do (pickle), as opposed to bytes that are broken."""


class NoEncoder(Exception):
    """No codec can encode this value for this extension (the caller words the error)."""


def describe_failure(exc: BaseException) -> str:
    """A reason that is the same for the same failure (no object addresses), so stats can count it."""
    msg = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(exc)).strip()
    if isinstance(exc, Refused):
        return msg
    return f"{msg} ({type(exc).__name__})" if msg else type(exc).__name__


def type_name(value: Any) -> str:
    """`int` for builtins, `module.Class` otherwise: what a user needs to find the type."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
