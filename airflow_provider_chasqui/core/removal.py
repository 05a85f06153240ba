"""chasquimq's job maintenance by id and by age, as flows for ``Queue``/``SyncQueue``:
``remove(job_id)`` / ``remove_report(job_id)`` and ``clean(grace_ms, limit, state)``.

``remove`` deletes what is left of one job: its delayed member, its waiting stream entry (or its
member of the prioritized set), its DLQ entries, and its records (stored result, failure record,
progress, log lines, cancelled marker).  A job a worker has read (a pending entry: running, or
waiting to be reclaimed) is never deleted, nor are its records: ``Queue.cancel`` ends it.  Jobs
held in job groups (``group=``, ``core/groups.py``) are not looked for (``drain`` empties them).
The report says where the job was found: ``{"delayed", "stream", "dlq", "result"}``
(``result``: a stored result or failure record); ``remove`` returns how many of them held it.
An id is looked for inside Redis (``core/scan.py``), so the stream and the DLQ are read, not
pulled over the network, from the time a ULID id carries on (every id this package makes).

``clean`` deletes up to ``limit`` jobs of one state (0: no limit) older than ``grace_ms``, with
their records as ``remove`` does, and returns their ids in the order the state keeps.  Age is
counted from when the job entered that state as the queue records it, oldest first:
``waiting`` its stream entry's time (when it was added or promoted), ``failed`` its DLQ entry's
(when it was dead-lettered), ``completed`` its stored result's (so only jobs whose results were
kept, ``store_results``).  ``delayed`` counts from the job's creation, and goes in due order,
soonest first (the set's order: members are read a page at a time until ``limit`` jobs old
enough were met or the set ended).

Every delete is decided in Redis at the instant it happens (``lua/remove_entries.lua``, ZREM),
so a job a worker takes or a promoter moves meanwhile is kept and not reported, never lost
halfway or run after being reported removed
(``tests/engine/test_removal.py::test_clean_and_remove_race_a_worker_without_losing_or_repeating_a_job``).
"""

from __future__ import annotations

from typing import Any

from ..errors import CodecError, ConfigError, ConfigTypeError
from .calls import Flow, command, int_reply, script_call, str_reply
from .codec import decode_envelope, split_member, ulid_ms
from .event_follow import after
from .job_details import SKEW_MS
from .key_types import read_types
from .keys import QueueKeys
from .running import check_job_id, take_delayed, take_member
from .scan import parse_scan, scan_call
from .settings import check_index

__all__ = ["REMOVE_PARTS", "CLEAN_STATES", "MAX_GRACE_MS", "MAX_CLEAN", "remove_report", "clean"]

REMOVE_PARTS = ("delayed", "stream", "dlq", "result")
CLEAN_STATES = ("waiting", "delayed", "failed", "completed")
MAX_GRACE_MS = 10 * 366 * 86_400_000  # ten years
MAX_CLEAN = 1_000_000  # jobs one clean removes (and what limit=0 means)
WINDOW = 1000  # entries or members read per round trip


def _job_id_of(raw: Any) -> str | None:
    try:
        return decode_envelope(bytes(raw)).id
    except (CodecError, TypeError, ValueError):
        return None


Rows = list[tuple[str, str]]  # (entry id, job id)


def _scan(stream: str, start: str, end: str, needle: bytes, limit: int) -> Flow[tuple[Rows, str | None]]:
    """``(entry id, job id)`` of up to ``limit`` entries from ``start`` to ``end`` whose ``d``
    holds ``needle`` (b"" = every entry), read inside Redis a window at a time, and where to go
    on from (None: the range ended)."""
    found: Rows = []
    nxt: str | None = start
    while nxt is not None and len(found) < limit:
        want = min(WINDOW, limit - len(found))
        reply = parse_scan(
            (yield scan_call(stream, nxt, end, count=WINDOW, needle=needle, whole_d=True, max_matches=want))
        )
        for entry_id, fields, _size in reply.matches:
            job_id = _job_id_of(fields.get("d", b""))
            if job_id is not None:
                found.append((entry_id, job_id))
        nxt = None if reply.done or not reply.last else after(reply.last)
    return found, nxt


def _delete_entries(stream: str, rows: Rows) -> Flow[list[str]]:
    """The job ids of ``rows`` whose entries ``lua/remove_entries.lua`` deleted."""
    if not rows:
        return []
    done = yield script_call("remove_entries", (stream,), [entry_id for entry_id, _ in rows])
    return [job_id for (_, job_id), hit in zip(rows, done or []) if int_reply(hit)]


def _search_start(job_id: str, now_ms: int) -> str:
    """Where a job's entries can begin: not before its ULID's time (less the producer's clock
    skew), as ``core/job_details.py`` looks; from the start for another id, or a ULID-shaped
    one from the future (a user's own id)."""
    created = ulid_ms(job_id)
    if created is None or created > now_ms + SKEW_MS:
        return "-"
    return f"{max(0, created - SKEW_MS)}-0"


def remove_report(queue: str, job_id: object, *, now_ms: int) -> Flow[dict[str, bool]]:
    """Where ``job_id`` was found and removed (see the module docstring)."""
    job_id = check_job_id(job_id)
    k = QueueKeys.for_queue(queue)
    start = _search_start(job_id, now_ms)
    types = yield from read_types([k.stream, k.delayed, k.dlq, k.prioritized, k.results, k.failures])
    delayed = False
    if types[k.delayed] == "zset":
        delayed = (yield from take_delayed(k, job_id)) is not None
    stream = False
    if types[k.stream] == "stream":
        rows, _ = yield from _scan(k.stream, start, "+", job_id.encode(), MAX_CLEAN)
        mine = [r for r in rows if r[1] == job_id]
        stream = bool((yield from _delete_entries(k.stream, mine)))
        if mine and not stream:  # a worker has it: the job and its records (progress, logs) stay
            return {"delayed": delayed, "stream": False, "dlq": False, "result": False}
    if not stream and types[k.prioritized] == "zset":
        stream = (yield from take_member(k.prioritized, job_id)) is not None
    dlq = False
    if types[k.dlq] == "stream":
        rows, _ = yield from _scan(k.dlq, start, "+", job_id.encode(), MAX_CLEAN)
        mine = [r for r in rows if r[1] == job_id]
        dlq = bool((yield from _delete_entries(k.dlq, mine)))
    records = yield from _forget(k, [job_id], types)
    return {"delayed": delayed, "stream": stream, "dlq": dlq, "result": records > 0}


def _forget(k: QueueKeys, job_ids: list[str], types: dict[str, str]) -> Flow[int]:
    """Delete the records of removed jobs (stored result, failure record, progress, log lines,
    cancelled marker, delayed-id index and marker) and their index entries; how many results
    and failure records there were."""
    if not job_ids:
        return 0
    records = [key for i in job_ids for key in (k.result(i), k.failure(i))]
    others = [key for i in job_ids for key in (k.progress(i), k.logs(i), k.cancelled(i), k.didx(i), k.dlid(i))]
    indexes = [command("ZREM", key, *job_ids) for key in (k.results, k.failures) if types.get(key) == "zset"]
    found, *_ = yield [command("DEL", *records), command("DEL", *others), *indexes]
    return int_reply(found)


def check_clean(grace_ms: object, limit: object, state: object) -> tuple[int, int, str]:
    """``clean``'s arguments: ``ValueError``/``TypeError`` naming the wrong one."""
    if not isinstance(state, str):
        raise ConfigTypeError(f"state must be a str, got {type(state).__name__}")
    if state not in CLEAN_STATES:
        raise ConfigError(f"clean cannot clean state {state[:80]!r}: expected one of {', '.join(CLEAN_STATES)}")
    grace = check_index("grace_ms", grace_ms, 0, MAX_GRACE_MS)
    return grace, check_index("limit", limit, 0, MAX_CLEAN) or MAX_CLEAN, state


def clean(queue: str, grace_ms: object, limit: object, state: object, *, now_ms: int) -> Flow[list[str]]:
    """The ids of the jobs of ``state`` older than ``grace_ms`` that were deleted, in the
    state's order (see the module docstring)."""
    grace, limit, state = check_clean(grace_ms, limit, state)
    k = QueueKeys.for_queue(queue)
    cutoff = now_ms - grace
    if cutoff < 0:
        return []
    key = {"waiting": k.stream, "failed": k.dlq, "delayed": k.delayed, "completed": k.results}[state]
    kind = "stream" if state in ("waiting", "failed") else "zset"
    types = yield from read_types(list(dict.fromkeys([key, k.results, k.failures])))
    if types[key] != kind:
        return []  # none, or another type (hostile): nothing of this state to clean
    if state == "delayed":
        removed = yield from _clean_delayed(k, cutoff, limit)
    elif state == "completed":
        removed = yield from _clean_results(k, cutoff, limit)
    else:
        removed = []
        start: str | None = "-"
        while start is not None and len(removed) < limit:  # entries by their ids' time: the range ends at the cutoff
            rows, start = yield from _scan(key, start, str(cutoff), b"", min(WINDOW, limit - len(removed)))
            removed += yield from _delete_entries(key, rows)
    for i in range(0, len(removed), WINDOW):
        yield from _forget(k, removed[i : i + WINDOW], types)
    return removed


def _clean_delayed(k: QueueKeys, cutoff: int, limit: int) -> Flow[list[str]]:
    """Delayed jobs created at or before ``cutoff``, read a page of members at a time in due
    order, each removed if no promoter moved it first."""
    removed: list[str] = []
    offset = 0
    while len(removed) < limit:
        members = (yield command("ZRANGE", k.delayed, offset, offset + WINDOW - 1)) or []
        doomed: list[tuple[Any, str]] = []
        for m in members:
            try:
                _name, env_raw = split_member(bytes(m))
                env = decode_envelope(env_raw)
            except CodecError:
                continue
            if env.created_at_ms <= cutoff and len(removed) + len(doomed) < limit:
                doomed.append((m, env.id))
        if doomed:
            hits = yield [command("ZREM", k.delayed, m) for m, _ in doomed]
            gone = [jid for (_, jid), hit in zip(doomed, hits) if int_reply(hit)]
            removed += gone
            offset -= len(gone)
        if len(members) < WINDOW:
            break
        offset += WINDOW
    return removed


def _clean_results(k: QueueKeys, cutoff: int, limit: int) -> Flow[list[str]]:
    """Completed jobs by their stored results' time (the results index's scores)."""
    ids = [
        str_reply(i) for i in (yield command("ZRANGE", k.results, "-inf", cutoff, "BYSCORE", "LIMIT", 0, limit)) or []
    ]
    if not ids:
        return []
    *hits, _ = yield [*(command("EXISTS", k.result(i)) for i in ids), command("ZREM", k.results, *ids)]
    return [i for i, hit in zip(ids, hits) if int_reply(hit)]  # (their results go with _forget)
