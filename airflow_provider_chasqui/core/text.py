"""Text from the queue made safe for a terminal or a line-based log.

Job names, handler errors, DLQ details and event fields come from producers and handlers, so
they may hold a newline (a forged log line), an ANSI escape (a terminal told to retitle, recolour
or move its cursor), or a bidirectional override (text that reads backwards).  Every
human-readable output (the human log format, CLI tables, ``chasqui events``) shows them escaped,
as ``\\n``, ``\\x1b``, ``\\u202e``; the JSON outputs are escaped by JSON itself.
"""

from __future__ import annotations

import re

__all__ = ["printable", "age"]

# C0 and C1 controls, DEL, the line and paragraph separators, and the bidirectional
# embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character escaped (a tab too: it breaks tables);
    ``keep_newlines`` keeps ``\\n`` (a traceback's lines).  Returns ``text`` itself when there
    is nothing to escape (the common case costs one regex scan)."""
    pattern = _UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def age(ms: int | None) -> str:
    """A duration as a viewer reads it: ``12.3 s``, ``4.5 min``, ``6.7 h`` (``-`` for none)."""
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
