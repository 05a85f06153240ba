"""Deduplication modes (issue 25), sans I/O: ``add(..., dedup_id=, dedup_mode=, dedup_ttl_ms=)``.

Besides ``add_unique`` (one job per key for a window, the first wins):

* ``dedup_mode="throttle"``: the first add of ``dedup_id`` runs now; repeats within
  ``dedup_ttl_ms`` add nothing, return the first job, and write a ``deduplicated`` event;
* ``dedup_mode="debounce"``: the job waits ``dedup_ttl_ms``; a repeat while it still waits
  replaces it (the new data, the start pushed back to ``dedup_ttl_ms`` from now) and writes a
  ``deduplicated`` event naming the replaced job and its replacement (``replaced_by``).  The
  replaced job never runs; a waiter on it sees no ending (wait on the id the last add returned).

One script does each add atomically (``lua/add_dedup.lua``), so producers racing on one id
agree: one job per window (throttle), one job waiting at a time (debounce).  The marker is
``{chasqui:<queue>}:dedup:<id>``.  A ChasquiMQ worker runs the jobs like any other; the
``deduplicated`` events are one more event kind for its readers.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .calls import Call, script_call
from .codec import MAX_JOB_ID_CHARS, utf8_text
from .keys import QueueKeys
from .running import MAX_TIMEOUT_MS, check_timeout_ms

__all__ = ["DEDUP_MODES", "MAX_DEDUP_TTL_MS", "check_dedup", "dedup_call"]

DEDUP_MODES = ("throttle", "debounce")
MAX_DEDUP_TTL_MS = MAX_TIMEOUT_MS


def check_dedup(dedup_id: object, mode: object, ttl_ms: object) -> tuple[str, str, int]:
    """The three options as a user gives them; ``ConfigError`` naming the bad one."""
    if not isinstance(dedup_id, str) or not dedup_id or len(dedup_id) > MAX_JOB_ID_CHARS:
        raise ConfigError(
            f"dedup_id must be a non-empty str of at most {MAX_JOB_ID_CHARS} characters, got {dedup_id!r}"
        )
    utf8_text(dedup_id, "dedup_id")
    if mode not in DEDUP_MODES:
        raise ConfigError(f"unknown dedup_mode {mode!r}; use one of {', '.join(DEDUP_MODES)}")
    return dedup_id, str(mode), check_timeout_ms(ttl_ms, "dedup_ttl_ms")  # the same bounds: (0, a week]


def dedup_call(
    keys: QueueKeys,
    dedup_id: str,
    mode: str,
    ttl_ms: int,
    *,
    job_id: str,
    envelope: bytes,
    name: bytes,
    member: bytes,
    max_stream_len: int,
    events_max: int,
) -> Call:
    """``lua/add_dedup.lua``; its reply is ``(status, job id)``: 1 added, 0 throttled, 2 replaced."""
    argv: list[Any] = [mode, ttl_ms, job_id, max_stream_len, envelope, name, member, events_max, dedup_id]
    return script_call("add_dedup", (keys.dedup(dedup_id), keys.stream, keys.delayed, keys.events), argv)
