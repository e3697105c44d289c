"""Text that came from data (member names, keys, URLs), made safe to print or write down.

A shard is input from strangers: a member name can hold an escape sequence that retitles the
terminal or clears it, a newline that forges an output line, a lone surrogate (a non-UTF-8 name read
with surrogateescape) that makes `print` raise, or 5 MB of name. Everything shardflow prints or
logs that came from data goes through `safe()` (or `safe_repr()` for keys); `cat` of member bytes
is the one exception (it writes data, as cat does). `redact_userinfo()` drops `user:password@`
from URLs in a text; storage.options.redact_urls also blanks secret query values.

This module is the lowest layer (it imports nothing of shardflow), so every layer may use it.
"""

from __future__ import annotations

import re
import unicodedata

MAX_TEXT = 300  # characters of one data-derived name kept in a message or an error file

# Unicode categories that are not text to show: controls, format characters (bidi overrides),
# surrogates (undecodable bytes), private use, line/paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_USERINFO = re.compile(r"(?<=://)[^/?#@\s]*@")


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if ch == " " or unicodedata.category(ch) not in _UNSAFE_CATEGORIES:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str) -> str:
    """`text` with control, format and surrogate characters written as Python escapes (`\\x1b`, `\\n`)."""
    if text.isprintable():
        return text
    return "".join(_escape_char(ch) for ch in text)


def truncate(text: str, limit: int = MAX_TEXT) -> str:
    """`text` cut to about `limit` characters, keeping both ends and saying how much was left out."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}...[{len(text) - head - tail} more characters]...{text[-tail:]}"


def safe(text: object, limit: int | None = MAX_TEXT) -> str:
    """`text` (or str(text)) escaped for a terminal and, unless `limit` is None, truncated."""
    out = text if isinstance(text, str) else str(text)
    if limit is not None:
        out = truncate(out, limit)
    return escape(out)


def safe_repr(text: object, limit: int | None = MAX_TEXT) -> str:
    """repr() of a key or name for messages, truncated; repr already escapes what a terminal obeys."""
    if not isinstance(text, str):
        return repr(text)
    return repr(truncate(text, limit) if limit is not None else text)


def redact_userinfo(text: str) -> str:
    """`text` with `user:password@` of every URL in it replaced by `***@`."""
    if "://" not in text or "@" not in text:
        return text
    return _USERINFO.sub("***@", text)
