"""The decisions of the shared event reader (``engine/event_hub.py``), free of I/O.

Many waiters of one process wait on one queue's events stream through one reader; the
reader's cost must be per event, not per event per waiter.  So each raw XREAD entry is
looked up once, by job id, in an index of the waiters' pending jobs; only the ids someone
waits for are decoded further, and only their outcomes are fetched.

Outcomes use ``wait_for_jobs``' shapes: ``("completed", result)`` or
``("failed", reason, detail, traceback)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from .calls import Call, command, str_reply
from .codec import decode_data, ulid_ms
from .failure import failure_record
from .keys import QueueKeys

__all__ = [
    "ENDING_EVENTS",
    "Waiter",
    "WaiterIndex",
    "event_hits",
    "outcome_calls",
    "parse_outcomes",
    "reader_name",
    "settle_hits",
]


class Completed(NamedTuple):
    """A job that completed: ``("completed", result)``."""

    state: str
    value: Any = None


class Failed(NamedTuple):
    """A job that failed for good: ``("failed", reason, detail, traceback)`` (detail and
    traceback empty when the events say only that it failed)."""

    state: str
    value: Any
    detail: str = ""
    traceback: str = ""


# How a job ended, as every wait reports it: named tuples of the shapes the waits always
# returned (``state, value = outcome`` and tuple equality keep working), read by name inside.
JobOutcome = Completed | Failed
Outcome = JobOutcome


def completed(value: Any = None) -> Completed:
    return Completed("completed", value)


def failed(reason: Any, detail: str = "", traceback: str = "") -> Failed:
    return Failed("failed", reason, detail, traceback)


ENDING_EVENTS = (b"completed", b"dlq", b"cancelled")  # after which a job has a stored outcome (or never will)
_MAX_NAME = 120


class Waiter:
    """One caller's wait: its pending ids, the outcomes found so far, and when it is done.

    ``done`` turns true once no id is pending, or (``stop_on_failure``) once one failed; the
    engine then wakes the caller (``wake``, set by the engine: a callable run once).
    """

    __slots__ = ("pending", "outcomes", "stop_on_failure", "done", "wake")

    def __init__(self, job_ids: Iterable[str], *, stop_on_failure: bool = False) -> None:
        self.pending: set[str] = set(job_ids)
        self.outcomes: dict[str, Outcome] = {}
        self.stop_on_failure = stop_on_failure
        self.done = not self.pending
        self.wake: Any = None

    def settle(self, job_id: str, outcome: Outcome) -> bool:
        """Record one outcome (the first one found wins); True when this made the wait done."""
        if self.done or job_id not in self.pending:
            return False
        self.pending.discard(job_id)
        self.outcomes[job_id] = outcome
        if not self.pending or (self.stop_on_failure and outcome.state == "failed"):
            self.done = True
            return True
        return False


class WaiterIndex:
    """Which waiters wait for which job, keyed by the id's bytes as the events carry it."""

    __slots__ = ("by_job", "waiters")

    def __init__(self) -> None:
        self.by_job: dict[bytes, list[Waiter]] = {}
        self.waiters: set[Waiter] = set()

    def __len__(self) -> int:
        return len(self.waiters)

    def add(self, waiter: Waiter) -> None:
        self.waiters.add(waiter)
        for jid in waiter.pending:
            self.by_job.setdefault(jid.encode(), []).append(waiter)

    def remove(self, waiter: Waiter) -> None:
        if waiter not in self.waiters:
            return
        self.waiters.discard(waiter)
        for jid in list(waiter.pending) + list(waiter.outcomes):
            key = jid.encode()
            ws = self.by_job.get(key)
            if ws is None:
                continue
            try:
                ws.remove(waiter)
            except ValueError:
                pass
            if not ws:
                del self.by_job[key]

    def pending_ids(self) -> list[str]:
        """Every id some waiter still waits for (what a reconnect checks again)."""
        return sorted({j for w in self.waiters if not w.done for j in w.pending})


def event_hits(rows: Any, by_job: dict[bytes, Any]) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """``(last entry id, {job id: (event, reason)})`` of one raw XREAD reply: the first ending
    event (completed, dlq) of each job in ``by_job``.  The hot path of the reader: one dict
    lookup per entry; entries are ``e <event> id <job> ...`` as this package's scripts write
    them, any other field order is parsed in full."""
    last = None
    hits: dict[str, tuple[str, str]] = {}
    for _stream, entries in rows or ():
        for entry_id, flat in entries:
            last = entry_id
            if not flat:
                continue
            if len(flat) >= 4 and flat[0] == b"e" and flat[2] == b"id":
                kind, jid = flat[1], flat[3]
            else:
                f = dict(zip(flat[::2], flat[1::2]))
                kind, jid = f.get(b"e", b""), f.get(b"id", b"")
            if jid in by_job and kind in ENDING_EVENTS and str_reply(jid) not in hits:  # the first one wins
                reason = ""
                if kind == b"dlq":
                    f = dict(zip(flat[::2], flat[1::2]))
                    reason = str_reply(f.get(b"reason", b""))
                elif kind == b"cancelled":  # Queue.cancel (core/running.py): a failure to whoever waits
                    reason = "cancelled"
                hits[str_reply(jid)] = (str_reply(kind), reason)
    return (None if last is None else str_reply(last)), hits


def outcome_calls(keys: QueueKeys, job_ids: list[str]) -> list[Call]:
    """GET of each job's result and failure records (one pipeline)."""
    calls: list[Call] = []
    for j in job_ids:
        calls += (command("GET", keys.result(j)), command("GET", keys.failure(j)))
    return calls


def parse_outcomes(
    job_ids: list[str], raws: list[Any], hints: dict[str, tuple[str, str]] | None = None
) -> dict[str, Outcome]:
    """Stored outcomes of ``job_ids`` from ``outcome_calls``' replies.  An id with no record
    but an ending event in ``hints`` (a worker that stores no results) gets the event's
    outcome: ``("completed", None)`` or ``("failed", reason, "", "")``; other ids are absent."""
    out: dict[str, Outcome] = {}
    for i, j in enumerate(job_ids):
        result, failure = raws[2 * i], raws[2 * i + 1]
        if result is not None:
            out[j] = completed(decode_data(result))
        elif failure is not None:
            record = failure_record(j, failure)
            if record is not None:
                out[j] = failed(record.reason, record.error, record.traceback)
        elif hints and j in hints:
            kind, reason = hints[j]
            out[j] = completed() if kind == "completed" else failed(reason)
    return out


#: A joining waiter looks this many events back (newest first) for its jobs' ending events.
BACKFILL_COUNT = 200
#: ... from this long before its earliest job's creation (client and server clocks differ).
BACKFILL_SLACK_MS = 1_000


def backfill_call(keys: QueueKeys, job_ids: list[str]) -> Call | None:
    """The events that may have ended ``job_ids`` before their waiter joined (the reader only
    sees what comes after it pinned its position, and a job whose worker stores no outcome
    leaves only its event): ``XREVRANGE`` back to the earliest job's creation, at most
    ``BACKFILL_COUNT`` entries.  None when no id carries a creation time (not ULIDs)."""
    times = [t for j in job_ids if (t := ulid_ms(j)) is not None]
    if not times:
        return None
    floor = max(0, min(times) - BACKFILL_SLACK_MS)
    return command("XREVRANGE", keys.events, "+", f"{floor}-0", "COUNT", BACKFILL_COUNT)


def backfill_hits(reply: Any, job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """``{job id: (event, reason)}`` of the ending events a ``backfill_call`` found."""
    if not isinstance(reply, list):  # an error reply (e.g. a wrong-typed events key): nothing found
        return {}
    return event_hits([(b"", reply)], dict.fromkeys(j.encode() for j in job_ids))[1]


def settle_hits(index: WaiterIndex, outcomes: dict[str, Outcome]) -> list[Waiter]:
    """Give each outcome to the waiters of its job; the waiters this finished."""
    finished: list[Waiter] = []
    for jid, outcome in outcomes.items():
        for w in list(index.by_job.get(jid.encode(), ())):
            if w.settle(jid, outcome):
                finished.append(w)
    return finished


def reader_name(queue: str) -> str:
    """``chasqui-events:<queue>``, the reader's CLIENT SETNAME: a name may hold no spaces or
    control characters, so others are written as ``%XX`` (UTF-8 bytes), and it is bounded."""
    safe = "".join(c if 33 <= ord(c) < 127 and c != "%" else "".join(f"%{b:02X}" for b in c.encode()) for c in queue)
    return ("chasqui-events:" + safe)[:_MAX_NAME]
