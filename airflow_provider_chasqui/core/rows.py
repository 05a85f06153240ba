"""The per-row layouts of the Lua scripts that take many jobs (or specs) per call.

Each script reads its ARGV by position, a fixed number of values per job after a head; each
layout is named here as a plain ``tuple[...]`` alias (built per job on hot paths, where a
``NamedTuple`` would cost more) with its field names beside it.  The script's header comment
lists the same names in the same order (``N per job: a, b, ...``); ``tests/core/test_rows.py``
checks the two against each other, so neither can drift.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "CompleteRow",
    "CancelRow",
    "CANCEL_ROW",
    "FailRow",
    "EnqueueRow",
    "DelayRow",
    "EnqueueOnceRow",
    "EnqueueSideRow",
    "EnqueueUniqueRow",
    "ReplayRow",
    "UpsertRow",
    "UpsertExtRow",
    "FireRow",
    "LUA_ROWS",
    "COMPLETE_ENTRY_ID",
    "FAIL_KIND",
    "FAIL_ENTRY_ID",
    "FAIL_REASON",
    "FAIL_TRACEBACK",
]

#: ``complete_batch.lua``, 6 per job (result b"" = nothing to store)
CompleteRow = tuple[bytes, str, str, int, int, bytes]
COMPLETE_ROW = ("entry_id", "job_id", "name", "attempt", "duration_us", "result")

#: ``fail_batch.lua``, 12 per entry: 7 common values, 4 of the entry's kind ('r' retry or 'd'
#: DLQ: the ``Any`` slots), then the traceback ("" = none; used by 'd' only)
FailRow = tuple[str, bytes, str, str, int, str, int, Any, Any, Any, Any, str]
_FAIL_HEAD = ("kind", "entry_id", "job_id", "name", "attempt", "failed_reason", "duration_us")
FAIL_RETRY_ROW = (*_FAIL_HEAD, "run_at_ms", "member", "next_attempt", "backoff_ms", "traceback")
FAIL_DEAD_ROW = (*_FAIL_HEAD, "payload", "dlq_reason", "detail", "dlq_name", "traceback")

#: positions read back by name (the consumer keeps these rows until they are written)
COMPLETE_ENTRY_ID: Final = 0
FAIL_KIND: Final = 0
FAIL_ENTRY_ID: Final = 1
FAIL_REASON: Final = 5
FAIL_TRACEBACK: Final = 11
assert COMPLETE_ROW[COMPLETE_ENTRY_ID] == "entry_id" and FAIL_RETRY_ROW[FAIL_REASON] == "failed_reason"
assert FAIL_DEAD_ROW[FAIL_KIND] == "kind" and FAIL_DEAD_ROW[FAIL_ENTRY_ID] == "entry_id"
assert FAIL_DEAD_ROW[FAIL_TRACEBACK] == FAIL_RETRY_ROW[FAIL_TRACEBACK] == "traceback"

#: ``enqueue_batch.lua``, 2 per job (name b"" = no ``n`` field)
EnqueueRow = tuple[bytes, bytes]
ENQUEUE_ROW = ("envelope", "name")

#: ``delay_batch.lua``, 2 per job (member = u32le name length + name + envelope)
DelayRow = tuple[int, bytes]
DELAY_ROW = ("run_at_ms", "member")

#: ``enqueue_batch_once.lua``, 3 per job (run_at 0: payload = envelope; else a delayed member)
EnqueueOnceRow = tuple[int, bytes, bytes]
ENQUEUE_ONCE_ROW = ("run_at", "payload", "name")

#: ``enqueue_batch_side_once.lua``, 4 per job (priority 0 = none, group "" = none)
EnqueueSideRow = tuple[int, str, bytes, bytes]
ENQUEUE_SIDE_ROW = ("priority", "group", "envelope", "name")

#: ``enqueue_batch_unique.lua``, 4 per job (payload as in ``EnqueueOnceRow``)
EnqueueUniqueRow = tuple[str, int, bytes, bytes]
ENQUEUE_UNIQUE_ROW = ("job_id", "run_at", "payload", "name")

#: ``replay_dlq.lua``, 3 per entry
ReplayRow = tuple[bytes, bytes, bytes]
REPLAY_ROW = ("dlq_id", "envelope", "name")

#: ``upsert_repeatable.lua``, 3 per spec (width 3), or 4 with the ext (width 4; b"" = none)
UpsertRow = tuple[int, str, bytes]
UPSERT_ROW = ("next_fire_ms", "spec_key", "stored_spec")
UpsertExtRow = tuple[int, str, bytes, bytes]
UPSERT_EXT_ROW = (*UPSERT_ROW, "ext")

#: ``schedule_batch.lua``'s common entry, 5 per spec: one fire, due now, at the score read
FireRow = tuple[str, Any, int, str, bytes]
FIRE_ROW = ("op", "expected", "next_fire_ms", "name", "envelope")

#: ``cancel_jobs.lua``, 3 per job (entry_id b"" = no entry: a delayed job taken out of its set)
CancelRow = tuple[bytes, str, str]
CANCEL_ROW = ("entry_id", "job_id", "name")

#: (script, row label) -> (the row type, its field names); the label tells rows of one script
#: apart (fail_batch's kinds, upsert_repeatable's widths, schedule_batch's ops), "" when alone
LUA_ROWS: dict[tuple[str, str], tuple[Any, tuple[str, ...]]] = {
    ("complete_batch", ""): (CompleteRow, COMPLETE_ROW),
    ("cancel_jobs", ""): (CancelRow, CANCEL_ROW),
    ("fail_batch", "r"): (FailRow, FAIL_RETRY_ROW),
    ("fail_batch", "d"): (FailRow, FAIL_DEAD_ROW),
    ("enqueue_batch", ""): (EnqueueRow, ENQUEUE_ROW),
    ("delay_batch", ""): (DelayRow, DELAY_ROW),
    ("enqueue_batch_once", ""): (EnqueueOnceRow, ENQUEUE_ONCE_ROW),
    ("enqueue_batch_unique", ""): (EnqueueUniqueRow, ENQUEUE_UNIQUE_ROW),
    ("enqueue_batch_side_once", ""): (EnqueueSideRow, ENQUEUE_SIDE_ROW),
    ("replay_dlq", ""): (ReplayRow, REPLAY_ROW),
    ("upsert_repeatable", "3"): (UpsertRow, UPSERT_ROW),
    ("upsert_repeatable", "4"): (UpsertExtRow, UPSERT_EXT_ROW),
    ("schedule_batch", "f"): (FireRow, FIRE_ROW),
}
