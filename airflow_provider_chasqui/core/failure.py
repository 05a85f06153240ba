"""How a failure is written down: its reason and its traceback, each clipped to a bound
(the ``failed`` event, the failure record and the DLQ entry's ``detail`` take them), and the
dead-lettered job's failure record as the API returns it (public home: ``types``).

Lives in the core because the sans-I/O consumer writes them and the producer decodes the
record; the core never imports upward.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from ..errors import CodecError, JobTimeout
from .codec import decode_data

__all__ = [
    "JobFailure",
    "failure_record",
    "handler_failure_reason",
    "handler_traceback",
    "clip_text",
    "clip_head",
    "MAX_REASON_BYTES",
    "MAX_TRACEBACK_BYTES",
    "TRACEBACK_FRAMES",
    "safe_repr",
]

MAX_REASON_BYTES = 4096
"""Longest failure reason or detail written to an event, a failure record or the DLQ (UTF-8)."""
MAX_TRACEBACK_BYTES = 4096
"""Longest handler traceback kept in a failure record and a DLQ entry's ``detail`` (UTF-8); a
longer one loses its outermost frames (the innermost, where it raised, are the useful ones)."""
_MAX_TRACEBACK_LINE = 1024  # bytes of one traceback line (the exception's message, a source line)
TRACEBACK_FRAMES = 40
"""Innermost frames formatted per exception of a chain: a deep recursion is not walked in full."""


def clip_text(text: str, limit: int = MAX_REASON_BYTES) -> str:
    """``text`` as at most ``limit`` UTF-8 bytes, cut with a marker saying how long it was;
    unencodable characters (lone surrogates) become U+FFFD, so the result always encodes."""
    if len(text) <= limit // 4 and text.isascii():
        return text
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return raw.decode("utf-8")
    marker = f"... [truncated: {len(raw)} bytes]"
    return raw[: limit - len(marker)].decode("utf-8", "ignore") + marker


def clip_head(text: str, limit: int = MAX_TRACEBACK_BYTES) -> str:
    """``text`` as at most ``limit`` UTF-8 bytes, keeping its *end* (cut at a line start, after
    a marker line saying how long it was); unencodable characters become U+FFFD."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return raw.decode("utf-8")
    marker = f"[traceback truncated: {len(raw)} bytes; the innermost frames follow]\n"
    tail = raw[len(raw) - (limit - len(marker)) :].decode("utf-8", "ignore")
    cut = tail.find("\n")
    if 0 <= cut < len(tail) - 1:
        tail = tail[cut + 1 :]
    return marker + tail


def handler_traceback(exc: BaseException) -> str:
    """The formatted traceback of a handler's exception (chained causes included), at most
    ``MAX_TRACEBACK_BYTES`` with the innermost frames kept; ``""`` for an exception that was
    never raised (nothing to add to its reason) or one that cannot be formatted.  Called on
    failures only: a successful job never pays for it."""
    tb = getattr(exc, "__traceback__", None)
    if tb is None:
        return ""
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb, limit=-TRACEBACK_FRAMES))
    except Exception:  # noqa: BLE001 - a hostile __str__ or a broken frame: no traceback, not a crash
        return ""
    if len(text) > MAX_TRACEBACK_BYTES // 4:  # a huge message (or source line) must not push out every frame
        text = "".join(
            clip_text(line.rstrip("\n"), _MAX_TRACEBACK_LINE) + "\n" * line.endswith("\n")
            if len(line) > _MAX_TRACEBACK_LINE // 4
            else line
            for line in text.splitlines(keepends=True)
        )
    return clip_head(text)


def handler_failure_reason(exc: BaseException) -> str:
    """The ``failed`` event reason ChasquiMQ's Python shim writes, clipped to
    ``MAX_REASON_BYTES`` (an exception's repr is unbounded, and may itself raise)."""
    if isinstance(exc, JobTimeout):  # the worker stopped it: reason ``timeout`` (core/running.py)
        return clip_text(f"timeout: {exc}")
    return clip_text(f"handler: Python handler raised: {safe_repr(exc)}")


def safe_repr(exc: BaseException) -> str:
    """``repr(exc)``, or a stand-in when a hostile ``__repr__`` raises or returns a non-str."""
    try:
        text = repr(exc)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the failure path
        return f"<{type(exc).__name__}: repr() failed>"
    return text if isinstance(text, str) else "<unprintable exception>"


@dataclass(frozen=True)
class JobFailure:
    """A dead-lettered job's failure record (kept by workers that store results, as
    ``chasqui worker`` does by default), as ``Queue.get_failure`` returns it.

    ``reason``: the DLQ reason (``retries_exhausted``, ``unrecoverable``...); ``error``: the
    handler's error (``handler: Python handler raised: ValueError('boom')``) or the DLQ detail;
    ``traceback``: the handler's formatted traceback, innermost frames kept (at most 4 KiB;
    ``""`` when none was recorded); ``finished_ms``: when it was dead-lettered (Unix ms).
    """

    job_id: str
    reason: str
    error: str
    traceback: str = ""
    finished_ms: int = 0


def failure_record(job_id: str, raw: Any) -> JobFailure | None:
    """A stored failure record ``[reason, detail, finished_ms(, traceback)]`` (the traceback
    since 0.x; older records have 3 elements); None when there is none or it cannot be read (a
    foreign or damaged key is shown as missing, never raised)."""
    if not isinstance(raw, (bytes, bytearray)):
        return None
    try:
        record = decode_data(bytes(raw))
    except (CodecError, TypeError, ValueError):
        return None
    if not isinstance(record, list) or len(record) < 2:
        return None
    finished = record[2] if len(record) > 2 and isinstance(record[2], int) else 0
    tb = str(record[3]) if len(record) > 3 and record[3] else ""
    return JobFailure(job_id, str(record[0]), str(record[1]), tb, finished)
