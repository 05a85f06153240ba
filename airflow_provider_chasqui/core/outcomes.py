"""What a finished wait says in a task log: the jobs, their queue, the state found, the attempts,
the result (cut to a size) or the failure reason, and how long it waited.

Sans-I/O: :func:`end_attempts` is a flow (the attempt numbers live only in the events stream's
``completed``/``dlq`` entries, so it reads the newest ones); the rest is text.  The Airflow
operators, the sensor and the trigger share these so their log lines read alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .calls import Flow, command, str_reply
from .keys import QueueKeys
from .producer import parse_fields

__all__ = [
    "end_attempts",
    "ids_text",
    "value_text",
    "attempts_text",
    "outcome_line",
    "ATTEMPTS_SCAN",
    "VALUE_TEXT_LIMIT",
]

#: Newest events read to find the attempt a job ended on: a bounded read, so a job that ended
#: long ago on a busy queue (its entry trimmed or further back) shows "attempts: unknown".
ATTEMPTS_SCAN = 2000
#: Characters of a result shown in a log line; the rest is cut (the result itself is in XCom).
VALUE_TEXT_LIMIT = 300


def end_attempts(keys: QueueKeys, job_ids: Iterable[str], scan: int = ATTEMPTS_SCAN) -> Flow[dict[str, int]]:
    """``{job_id: attempt}`` (1-based) of the run each job ended on, from the newest ``scan``
    events; ids whose ``completed``/``dlq`` entry is not among them are absent."""
    wanted = set(job_ids)
    found: dict[str, int] = {}
    if not wanted:
        return found
    rows = yield command("XREVRANGE", keys.events, "+", "-", "COUNT", scan)
    for _entry_id, flat in rows or []:
        f = parse_fields(flat or [])
        jid = str_reply(f.get("id", b""))
        if jid in wanted and jid not in found and str_reply(f.get("e", b"")) in ("completed", "dlq"):
            try:
                found[jid] = int(str_reply(f.get("attempt", b"")))
            except ValueError:  # an entry some other writer made: no number to show
                continue
    return found


def ids_text(ids: list[str]) -> str:
    """``job 01H...`` or ``3 jobs (01H..., 01H..., ...)``: the log names what it waited for."""
    if len(ids) == 1:
        return f"job {ids[0]}"
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return f"{len(ids)} jobs ({shown})"


def value_text(value: Any, limit: int = VALUE_TEXT_LIMIT) -> str:
    """``repr(value)``, cut at ``limit`` characters (a result may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text)} characters]"


def attempts_text(ids: list[str], attempts: Mapping[str, int] | None) -> str:
    """``2``; for several jobs ``1 each`` or ``1 to 3``; ``unknown`` when not found."""
    known = [attempts[j] for j in ids if attempts and j in attempts]
    if not known:
        return "unknown"
    if len(ids) == 1:
        return str(known[0])
    low, high = min(known), max(known)
    text = f"{low} each" if low == high else f"{low} to {high}"
    missing = len(ids) - len(known)
    return text + (f" ({missing} unknown)" if missing else "")


def outcome_line(
    queue: str,
    ids: list[str],
    state: str,
    *,
    attempts: Mapping[str, int] | None = None,
    waited: float | None = None,
    results: Mapping[str, Any] | None = None,
    reason: str | None = None,
) -> str:
    """One log line for a wait's outcome, e.g.
    ``queue q: job 01H... completed; attempts: 1; waited 2.31 s; result: {'x': 3}``.

    ``attempts`` None leaves the attempts out (the trigger does not look them up); ``results``
    (``{job_id: result}``) shows one result, or the mapping for several jobs.
    """
    parts = [f"queue {queue}: {ids_text(ids)} {state}"]
    if attempts is not None:
        parts.append(f"attempts: {attempts_text(ids, attempts)}")
    if waited is not None:
        parts.append(f"waited {waited:.2f} s")
    if reason is not None:
        parts.append(f"reason: {_cut(reason)}")
    if results is not None:
        parts.append(
            f"result: {value_text(results[ids[0]])}"
            if len(ids) == 1 and ids[0] in results
            else f"results: {value_text(dict(results))}"
        )
    return "; ".join(parts)


def _cut(text: str, limit: int = VALUE_TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text)} characters]"
