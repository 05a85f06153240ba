"""chasquimq's introspection API as flows: counts by state, a page of the jobs of one state, one
job (``Queue.get_job_counts``, ``count``, the
``get_*_count`` helpers, ``get_jobs`` and ``get_job``, and their sync twins).

The counts are one read-only script's (``core/counts.py``), the same the read model every
viewer shares reads (``core/inspect.snapshot``), so they agree with ``chasqui inspect`` and the
dashboard:

* ``waiting``: stream entries the consumer group has not read yet (every entry when the group
  does not exist yet), plus jobs added with a priority that have not entered the stream;
* ``active``: entries read and not acknowledged (running, or waiting to be reclaimed);
* ``delayed``: the delayed set (``delay_ms`` and retry backoffs); ``failed``: the DLQ;
* ``completed``: jobs completed over the history's retention (8 days, ``core/history.py``),
  as workers add them with their heartbeat: a few seconds behind;
* ``paused``: 1 while the queue is paused (``Queue.pause``), else 0.

Jobs held in job groups (``group=``, ``core/groups.py``) are not in these counts until they
enter the stream: ``inspect().job_group_rows`` shows them.  The counts but ``completed`` are
one instant's (``core/counts.py``); ``completed`` is read after them, from the history.

A page reads where its state lives, in order: ``waiting`` the stream after the group's last
read entry, then the prioritized set; ``active`` the group's pending list; ``delayed`` the
delayed set, soonest first; ``failed`` the DLQ, oldest first; ``completed`` the newest
``completed`` events, newest first (completed jobs keep no data: their ``data`` is None).
Entries skipped by ``offset`` are read inside Redis with their fields cut to a byte, so a deep
offset moves ids, not payloads.  A key of another type (hostile) reads as empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import CodecError, ConfigError, ConfigTypeError, JobNotFound
from .calls import Flow, command, int_reply, reply_pairs, str_reply
from .codec import decode_data, decode_envelope, split_member, ulid_ms
from .counts import counts_call, parse_counts
from .event_follow import after
from .history import HOUR_MS, RETAIN_MS, history_flow
from .inspect import group_row
from .job_details import job_details
from .key_types import read_types
from .keys import QueueKeys, check_consumer_name
from .running import parse_progress
from .scan import parse_scan, scan_call
from .settings import check_index

__all__ = [
    "COUNT_TYPES",
    "JOB_STATES",
    "MAX_OFFSET",
    "MAX_LIMIT",
    "JobRow",
    "job_counts",
    "jobs_page",
    "one_job",
    "merge_counts",
]

# (id, name, data, attempt, created_at_ms, progress, stalled_count): the fields of a ``Job``,
# which the queues build (the core never imports upward).  ``attempt`` is the envelope's count of
# failed runs, as handlers see it; ``progress`` the latest its handler reported (None: none);
# ``stalled_count`` a running job's take-overs (its entry's deliveries - 1), None for the others.
JobRow = tuple[str, str, Any, int, int, Any, int | None]

COUNT_TYPES = ("waiting", "active", "delayed", "completed", "failed", "paused")
JOB_STATES = ("waiting", "active", "delayed", "completed", "failed")
MAX_OFFSET = 1_000_000  # entries a page may skip
MAX_LIMIT = 10_000  # jobs one page returns
SKIP_STEP = 10_000  # entries one skipping look reads inside Redis
EVENTS_PAGE = 1000


def check_count_types(types: Iterable[object]) -> tuple[str, ...]:
    """The count names asked for (all of them when none): a ``ValueError`` names a wrong one."""
    wanted: list[str] = []
    for t in types:
        if not isinstance(t, str):
            raise ConfigTypeError(f"a job count type must be a str, got {type(t).__name__}")
        if t not in COUNT_TYPES:
            raise ConfigError(f"unknown job count type {t[:80]!r}: expected one of {', '.join(COUNT_TYPES)}")
        wanted.append(t)
    return tuple(wanted) or COUNT_TYPES


def _check_page(state: object, offset: object, limit: object) -> tuple[str, int, int]:
    if not isinstance(state, str):
        raise ConfigTypeError(f"state must be a str, got {type(state).__name__}")
    if state not in JOB_STATES:
        raise ConfigError(f"unknown state {state[:80]!r}: expected one of {', '.join(JOB_STATES)}")
    return state, check_index("offset", offset, 0, MAX_OFFSET), check_index("limit", limit, 1, MAX_LIMIT)


def job_counts(queue: str, *, group: str, types: Iterable[object] = (), now_ms: int) -> Flow[dict[str, int]]:
    """``{type: count}`` for the types asked (all when none), in the order asked: one instant's
    (``core/counts.py``), but ``completed``, read after them from the history."""
    wanted = check_count_types(types)
    check_consumer_name(group)
    c = parse_counts((yield counts_call(QueueKeys.for_queue(queue), group)))
    counts = {
        "waiting": c.waiting_or_estimate + c.prioritized,
        "active": c.active,
        "delayed": c.delayed,
        "failed": c.failed,
        "paused": int(c.paused),
    }
    if "completed" in wanted:
        counts["completed"] = (yield from history_flow(queue, now_ms, RETAIN_MS, HOUR_MS)).total_completed
    return {t: counts[t] for t in wanted}


def _row(job_id: str, name: str, env_inner: bytes, attempt: int, created: int) -> JobRow:
    try:
        data = decode_data(env_inner)
    except Exception:  # noqa: BLE001 - shown as its bytes rather than hidden
        data = env_inner
    return job_id, name, data, attempt, created, None, None


def _entry_row(fields: dict[str, Any]) -> JobRow | None:
    """The job of a stream or DLQ entry (fields as bytes); None for an entry that is no job."""
    try:
        env = decode_envelope(bytes(fields.get("d", b"")))
    except (CodecError, TypeError):
        return None
    return _row(env.id, str_reply(fields.get("n", b"")), env.inner, env.attempt, env.created_at_ms)


def _member_row(member: Any) -> JobRow | None:
    try:
        name, env_raw = split_member(bytes(member))
        env = decode_envelope(env_raw)
    except CodecError:
        return None
    return _row(env.id, name, env.inner, env.attempt, env.created_at_ms)


def _skip(stream: str, start: str, n: int) -> Flow[tuple[str | None, int]]:
    """``(the exclusive start after n entries from start, entries skipped)``, reading inside
    Redis with fields cut to a byte (ids cross the network, not payloads); the start is None
    when the stream ended first."""
    skipped = 0
    while skipped < n:
        step = min(n - skipped, SKIP_STEP)
        reply = parse_scan((yield scan_call(stream, start, count=step, clip=1, max_matches=step)))
        skipped += reply.scanned
        nxt = after(reply.last) if reply.last else None
        if nxt is None or (reply.done and skipped < n):
            return None, skipped
        start = nxt
    return start, skipped


def _stream_page(stream: str, start: str, offset: int, limit: int) -> Flow[tuple[list[JobRow], int]]:
    """``limit`` jobs from ``start`` after ``offset`` entries, and how many entries were passed
    (skipped or read: the count of the range when it ended before ``limit``)."""
    first, skipped = yield from _skip(stream, start, offset)
    if first is None:
        return [], skipped
    rows = (yield command("XRANGE", stream, first, "+", "COUNT", limit)) or []
    jobs = [j for _eid, flat in rows if (j := _entry_row(reply_pairs(flat or []))) is not None]
    return jobs, skipped + len(rows)


def jobs_page(queue: str, state: object, *, group: str, offset: object = 0, limit: object = 100) -> Flow[list[JobRow]]:
    """A page of the jobs in ``state`` (see the module docstring for where each is read), each
    with the latest progress its handler reported (one MGET for the page)."""
    state, skip, limit = _check_page(state, offset, limit)
    check_consumer_name(group)
    k = QueueKeys.for_queue(queue)
    rows = yield from _page(k, state, group, skip, limit)
    if not rows:
        return rows
    raws = yield command("MGET", *(k.progress(r[0]) for r in rows))  # a key of another type reads as nil
    return [(*r[:5], parse_progress(p), r[6]) for r, p in zip(rows, raws or [])]


def _page(k: QueueKeys, state: str, group: str, skip: int, limit: int) -> Flow[list[JobRow]]:
    """One read per state."""
    key = {"waiting": k.stream, "active": k.stream, "delayed": k.delayed, "failed": k.dlq, "completed": k.events}[state]
    kind = "zset" if state == "delayed" else "stream"
    types = yield from read_types([key, k.prioritized])
    if types[key] != kind and (state != "waiting" or types[k.prioritized] != "zset"):
        return []  # none, or another type (hostile): nothing of this state can be read
    if state == "delayed":
        return [j for m in (yield command("ZRANGE", k.delayed, skip, skip + limit - 1)) or [] if (j := _member_row(m))]
    if state == "failed":
        return (yield from _stream_page(k.dlq, "-", skip, limit))[0]
    if state == "completed":
        return (yield from _completed(k, skip, limit))
    mine = None
    if types[key] == "stream":
        groups = yield command("XINFO", "GROUPS", k.stream)  # XPENDING on a missing group is an error
        mine = next((g for g in map(group_row, groups or []) if g["name"] == group), None)
    if state == "active":
        if mine is None:
            return []
        pending = ((yield command("XPENDING", k.stream, group, "-", "+", skip + limit)) or [])[skip:]
        rows = (yield [command("XRANGE", k.stream, p[0], p[0]) for p in pending]) if pending else []
        return [
            (*j[:6], max(0, int_reply(p[3]) - 1))  # an XPENDING row: id, consumer, idle ms, deliveries
            for p, r in zip(pending, rows or [])
            if r and (j := _entry_row(reply_pairs(r[0][1] or []))) is not None
        ]
    jobs: list[JobRow] = []
    passed = 0
    if types[key] == "stream":
        delivered = mine["last_delivered"] if mine is not None else "0-0"
        start = "-" if delivered == "0-0" else after(delivered)
        if start is not None:
            jobs, passed = yield from _stream_page(k.stream, start, skip, limit)
    if len(jobs) < limit and types[k.prioritized] == "zset":  # the stream part ended: then the prioritized
        first = max(0, skip - passed)
        members = (yield command("ZRANGE", k.prioritized, first, first + limit - len(jobs) - 1)) or []
        jobs += [j for m in members if (j := _member_row(m)) is not None]
    return jobs


def _completed(k: QueueKeys, skip: int, limit: int) -> Flow[list[JobRow]]:
    """Newest first, from ``completed`` events, at most ``MAX_OFFSET + MAX_LIMIT`` events read."""
    jobs: list[JobRow] = []
    end, seen = "+", 0
    while len(jobs) < limit and seen < MAX_OFFSET + MAX_LIMIT:
        rows = (yield command("XREVRANGE", k.events, end, "-", "COUNT", EVENTS_PAGE)) or []
        for eid, flat in rows:
            f = reply_pairs(flat or [])
            seen += 1
            if f.get("e") != b"completed" or len(jobs) >= limit:
                continue
            if skip:
                skip -= 1
                continue
            job_id, ran = str_reply(f.get("id", b"")), str_reply(f.get("attempt", b""))
            created = ulid_ms(job_id) or int(str_reply(eid).partition("-")[0])
            attempt = max(0, int(ran) - 1) if ran.isdigit() else 0  # events number runs from 1
            jobs.append((job_id, str_reply(f.get("n", b"")), None, attempt, created, None, None))
        if len(rows) < EVENTS_PAGE:
            break
        end = "(" + str_reply(rows[-1][0])
    return jobs


def one_job(queue: str, job_id: str, *, group: str) -> Flow[JobRow | None]:
    """The job's row (its data, name and attempt count as stored), found as
    ``get_job_details`` finds it; None when nothing is known of the id.  A completed job keeps
    no data: its ``data`` is None."""
    try:
        d = yield from job_details(queue, job_id, group=group)
    except JobNotFound:
        return None
    created = d.created_at_ms if d.created_at_ms is not None else (ulid_ms(job_id) or 0)
    attempt = d.envelope_attempt if d.envelope_attempt is not None else max(0, (d.attempt or 1) - 1)
    stalled = max(0, d.deliveries - 1) if d.state == "active" and d.deliveries is not None else None
    return job_id, d.name or "", d.data, attempt, created, d.progress, stalled


def merge_counts(per_shard: list[dict[str, int]]) -> dict[str, int]:
    """The counts of a sharded queue: each shard's summed, ``paused`` 1 only when every shard
    is paused (as ``ShardedQueue.is_paused``)."""
    out: dict[str, int] = {}
    for counts in per_shard:
        for t, n in counts.items():
            out[t] = min(out.get(t, n), n) if t == "paused" else out.get(t, 0) + n
    return out


def job_total(counts: dict[str, int]) -> int:
    """``count()``: the jobs still to finish (waiting, active and delayed)."""
    return counts["waiting"] + counts["active"] + counts["delayed"]
