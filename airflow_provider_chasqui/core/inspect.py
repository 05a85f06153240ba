"""Read-only views of queues for people, scripts and dashboards: a queue's snapshot
(``chasqui inspect``/``watch``), every queue with its counts (``chasqui queues``) and one
job's whole story (``chasqui job show``).

:func:`snapshot`: one flow, two round trips: the counters in one pipeline, then consumer details only when
the stream and its group exist (XINFO on a missing group is an error, not an empty list).
Corrupt data renders instead of failing the snapshot: a spec key that is not UTF-8 shows
escaped, a score that is no instant (+-inf) shows as Redis' text of it.

:func:`list_queues`: a cursor SCAN of ``{chasqui:*`` (never KEYS), capped in calls, then the
counts of every queue found in one pipeline.  :func:`job_details`: the job's result, failure
record and events, then where it is now (delayed, waiting, running or dead-lettered), each
search bounded; what a bound cut short is said in ``notes``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CodecError, ConfigError, JobNotFound
from .calls import Flow, command, int_reply, reply_pairs, str_reply
from .codec import Envelope, decode_data, decode_envelope, split_member, ulid_ms
from .codec import now_ms as current_ms
from .consumer import RETRIES_EXHAUSTED, ROUTING_FAILED, UNRECOVERABLE
from .controls import NO_CONTROLS, RateLimit, controls_call, parse_controls
from .keys import QueueKeys
from .liveness import REAP_IDLE_LEASES, WorkerRecord, live_consumers, read_workers
from .maintenance import glob_escape
from .origin import Origin, parse_origin
from .running import parse_progress
from .scan import parse_scan, scan_call
from .schedules import show_key

__all__ = [
    "QueueSnapshot",
    "ConsumerInfo",
    "snapshot",
    "QueueSummary",
    "QueueListing",
    "list_queues",
    "JobDetails",
    "job_details",
    "latest_attempt",
    "queue_of_key",
]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    name: str
    pending: int
    idle_ms: int
    live: bool | None = None  # its worker's heartbeat says alive (core/liveness.py); None: it does not beat


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """One queue as every viewer sees it: ``chasqui inspect``/``watch``, the dashboard's queue
    rows and pages, and a worker's Prometheus depth gauges all read this (one flow, so they
    agree by construction)."""

    queue: str
    stream: int
    pending: int
    delayed: int
    oldest_delayed_lag_ms: int | None
    dlq: int
    specs: int
    paused_specs: int
    next_fires: list[tuple[str, int | str]]  # (spec key, epoch ms, or the score's text when no instant)
    promoter_leader: str | None
    scheduler_leader: str | None
    group_exists: bool
    consumers: list[ConsumerInfo] = field(default_factory=list)
    waiting: int | None = None  # entries not yet delivered to the group (its lag; None: Redis cannot tell)
    oldest_waiting_ms: int | None = None  # age of the oldest of them (by its stream id), None when none
    overdue: int = 0  # delayed jobs already due (the promoter is behind)
    quarantined: int = 0  # repeatable specs set aside as unreadable
    groups: list[dict[str, Any]] = field(default_factory=list)  # every group of the stream (XINFO GROUPS)
    paused: bool = False  # Queue.pause(): no worker starts its jobs (core/controls.py)
    rate_limit: RateLimit | None = None  # Queue.set_rate_limit(), as the workers read it
    concurrency: int | None = None  # Queue.set_concurrency(), as the workers read it
    slots_held: int = 0  # concurrency slots held now (jobs running under the limit)
    prioritized: int = 0  # jobs added with a priority, waiting to enter the stream (core/priorities.py)
    job_groups: int = 0  # job groups with waiting jobs (core/groups.py)
    # the first JOB_GROUP_ROWS of them in turn order: (group, waiting jobs, running jobs under its limit)
    job_group_rows: list[tuple[str, int, int]] = field(default_factory=list)
    workers: list[WorkerRecord] = field(default_factory=list)  # the heartbeats (core/liveness.py), newest first
    reap_idle_ms: int = REAP_IDLE_LEASES * 30_000  # a consumer that does not beat counts as alive below this idle

    @property
    def consumer_max_idle_ms(self) -> int:
        """The longest idle time among consumers whose worker does not say it is alive (a beating
        worker on Redis 7.0 looks idle while it waits on an empty queue: never counted here)."""
        return max((c.idle_ms for c in self.consumers if not c.live), default=0)

    @property
    def live_consumers(self) -> int:
        """The consumers alive now (``core/liveness.live_consumers``): what every viewer counts."""
        return live_consumers(self.consumers, self.workers, self.reap_idle_ms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_ms(raw: Any) -> int | str:
    """A ZSET score as epoch ms, or its text ("inf", "-inf") when it is no finite instant."""
    value = float(raw)
    return int(value) if math.isfinite(value) else str_reply(raw)


def _group_row(flat: list[Any]) -> dict[str, Any]:
    info = reply_pairs(flat or [])
    return {
        "name": str_reply(info.get("name", b"")),
        "pending": int_reply(info.get("pending", 0)),
        "consumers": int_reply(info.get("consumers", 0)),
        "last_delivered": str_reply(info.get("last-delivered-id", b"0-0")),
        "lag": None if info.get("lag") is None else int_reply(info["lag"]),
    }


JOB_GROUP_ROWS = 10  # the job groups a snapshot details (the next ones in turn)


def snapshot(queue: str, *, group: str = "default", now_ms: int, next_fires: int = 5) -> Flow[QueueSnapshot]:
    """A :class:`QueueSnapshot`: the counters in one pipeline, then the groups, the group's
    consumers and the oldest waiting entry only where they exist (XINFO on a missing stream or
    group is an error, not an empty list)."""
    k = QueueKeys.for_queue(queue)
    (
        stream,
        delayed,
        oldest,
        dlq,
        specs,
        paused,
        fires,
        promoter,
        scheduler,
        exists,
        overdue,
        quarantined,
        ctl,
        slots_type,
        prioritized,
        job_groups,
    ) = yield [
        command("XLEN", k.stream),
        command("ZCARD", k.delayed),
        command("ZRANGE", k.delayed, 0, 0, "WITHSCORES"),
        command("XLEN", k.dlq),
        command("ZCARD", k.repeat),
        command("ZCARD", k.repeat_paused),
        command("ZRANGE", k.repeat, 0, max(0, next_fires - 1), "WITHSCORES"),
        command("GET", k.promoter_lock),
        command("GET", k.scheduler_lock),
        command("EXISTS", k.stream),
        command("ZCOUNT", k.delayed, "-inf", now_ms),
        command("HLEN", k.repeat_quarantine),
        command("TYPE", k.controls),
        command("TYPE", k.running),
        command("ZCARD", k.prioritized),
        command("ZCARD", k.groups),
    ]
    controls = parse_controls((yield controls_call(k))) if str_reply(ctl) == "hash" else NO_CONTROLS
    group_rows: list[tuple[str, int, int]] = []
    if int_reply(job_groups):
        names = [str_reply(g) for g in (yield command("ZRANGE", k.groups, 0, JOB_GROUP_ROWS - 1)) or []]
        counts = (
            []
            if not names
            else (
                yield [
                    c for g in names for c in (command("LLEN", k.group_jobs(g)), command("ZCARD", k.group_running(g)))
                ]
            )
        )
        group_rows = [(g, int_reply(counts[2 * i]), int_reply(counts[2 * i + 1])) for i, g in enumerate(names)]
    held = 0  # slots not past their lease (a dead worker's lapse; take_starts.lua purges them)
    if controls.concurrency is not None and str_reply(slots_type) == "zset":
        held = int_reply((yield command("ZCOUNT", k.running, f"({now_ms}", "+inf")))
    workers = yield from read_workers(k, now_ms)  # another type (hostile): none, consumers judged by idle
    live = {w.consumer: w.live for w in workers}
    consumers: list[ConsumerInfo] = []
    groups = [_group_row(g) for g in ((yield command("XINFO", "GROUPS", k.stream)) if int_reply(exists) else []) or []]
    mine = next((g for g in groups if g["name"] == group), None)
    if mine is not None:
        for row in (yield command("XINFO", "CONSUMERS", k.stream, group)) or []:
            info = reply_pairs(row)
            name = str_reply(info["name"])
            consumers.append(
                ConsumerInfo(name, int_reply(info.get("pending", 0)), int_reply(info.get("idle", 0)), live.get(name))
            )
    waiting = mine["lag"] if mine is not None else int_reply(stream)
    oldest_waiting = None
    if int_reply(stream):
        after = mine["last_delivered"] if mine is not None else "0-0"
        first = yield command("XRANGE", k.stream, f"({after}" if after != "0-0" else "-", "+", "COUNT", 1)
        if first:
            oldest_waiting = max(0, now_ms - int(str_reply(first[0][0]).partition("-")[0] or 0))
        elif waiting is None:
            waiting = 0
    first_due = score_ms(oldest[1]) if oldest else None
    pairs = [(show_key(fires[i]), score_ms(fires[i + 1])) for i in range(0, len(fires or []), 2)]
    return QueueSnapshot(
        queue=queue,
        stream=int_reply(stream),
        pending=mine["pending"] if mine is not None else 0,
        delayed=int_reply(delayed),
        oldest_delayed_lag_ms=max(0, now_ms - first_due) if isinstance(first_due, int) else None,
        dlq=int_reply(dlq),
        specs=int_reply(specs),
        paused_specs=int_reply(paused),
        next_fires=pairs,
        promoter_leader=str_reply(promoter) if promoter else None,
        scheduler_leader=str_reply(scheduler) if scheduler else None,
        group_exists=mine is not None,
        consumers=consumers,
        workers=workers,
        waiting=waiting,
        oldest_waiting_ms=oldest_waiting,
        overdue=int_reply(overdue),
        quarantined=int_reply(quarantined),
        groups=groups,
        paused=controls.paused,
        rate_limit=controls.rate,
        concurrency=controls.concurrency,
        slots_held=held,
        prioritized=int_reply(prioritized),
        job_groups=int_reply(job_groups),
        job_group_rows=group_rows,
    )


# ---- every queue ------------------------------------------------------------------------------
SCAN_COUNT = 1000
MAX_SCAN_CALLS = 100


@dataclass(frozen=True, slots=True)
class QueueSummary:
    queue: str
    waiting: int  # stream entries not pending in a group (not yet read by a worker)
    pending: int  # delivered and not acknowledged: running, or waiting to be reclaimed
    delayed: int
    dlq: int
    specs: int  # active repeatable specs
    paused_specs: int
    consumers: int
    groups: int
    paused: bool = False  # Queue.pause(): no worker starts its jobs
    rate_limit: RateLimit | None = None  # Queue.set_rate_limit()
    concurrency: int | None = None  # Queue.set_concurrency()
    prioritized: int = 0  # jobs added with a priority, not in the stream yet
    workers: int = 0  # workers whose heartbeat says alive (core/liveness.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueListing:
    queues: list[QueueSummary]
    truncated: bool  # the scan stopped at its call cap or at ``limit``: more queues may exist
    cursor: str  # SCAN cursor to continue from ("0" when the scan finished)
    scan_calls: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "queues": [q.to_dict() for q in self.queues],
            "truncated": self.truncated,
            "cursor": self.cursor,
            "scan_calls": self.scan_calls,
        }


_TAG = b"{chasqui:"


def queue_of_key(key: Any) -> str | None:
    """The queue a ``{chasqui:<q>}...`` key belongs to; None for any other key."""
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8", "surrogateescape")
    if not raw.startswith(_TAG):
        return None
    end = raw.find(b"}", len(_TAG))
    if end <= len(_TAG):
        return None
    try:
        return raw[len(_TAG) : end].decode("utf-8")
    except UnicodeDecodeError:
        return None


def list_queues(
    *,
    match: str = "*",
    limit: int = 1000,
    cursor: str = "0",
    scan_count: int = SCAN_COUNT,
    max_scan_calls: int = MAX_SCAN_CALLS,
) -> Flow[QueueListing]:
    """Every queue whose name matches the glob ``match``, with its counts: a
    :class:`QueueListing`, sorted by name.  At most ``max_scan_calls`` SCAN calls of
    ``scan_count`` keys (about 100,000 keys by default) and ``limit`` queues; ``truncated``
    says a cap stopped it (pass ``cursor`` on to continue; a queue may then show up again)."""
    for what, value in (("limit", limit), ("scan_count", scan_count), ("max_scan_calls", max_scan_calls)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{what} must be a positive int, got {value!r}")
    if not isinstance(match, str) or not match or any(c in match for c in "{}\r\n\0"):
        raise ConfigError(f"match must be a non-empty glob without braces or control characters, got {match!r}")
    pattern = "{chasqui:" + match + "}*"
    names: set[str] = set()
    calls = 0
    cursor = str(cursor)
    while True:
        cursor, keys = yield command("SCAN", cursor, "MATCH", pattern, "COUNT", scan_count)
        cursor, calls = str_reply(cursor), calls + 1
        for key in keys or []:
            name = queue_of_key(key)
            if name is not None and "{" not in name:
                names.add(name)
        if cursor == "0" or calls >= max_scan_calls or len(names) >= limit:
            break
    ordered = sorted(names)[:limit]
    truncated = cursor != "0" or len(names) > limit
    summaries = yield from queue_summaries(ordered)
    return QueueListing(queues=summaries, truncated=truncated, cursor=cursor, scan_calls=calls)


_PER_QUEUE = 8  # calls per queue in queue_summaries' first pipeline


def queue_summaries(queues: list[str]) -> Flow[list[QueueSummary]]:
    """The counts of each queue, in two pipelines whatever their number."""
    if not queues:
        return []
    keys = [QueueKeys.for_queue(q) for q in queues]
    calls = []
    for k in keys:
        calls += [
            command("TYPE", k.stream),
            command("ZCARD", k.delayed),
            command("EXISTS", k.dlq),
            command("ZCARD", k.repeat),
            command("ZCARD", k.repeat_paused),
            command("TYPE", k.controls),
            command("ZCARD", k.prioritized),
            command("TYPE", k.beats),
        ]
    first = yield calls
    now = current_ms()
    streams = [i for i, _ in enumerate(keys) if str_reply(first[_PER_QUEUE * i]) == "stream"]
    dlqs = [i for i, _ in enumerate(keys) if int_reply(first[_PER_QUEUE * i + 2])]
    ctls = [i for i, _ in enumerate(keys) if str_reply(first[_PER_QUEUE * i + 5]) == "hash"]
    beating = [i for i, _ in enumerate(keys) if str_reply(first[_PER_QUEUE * i + 7]) == "zset"]
    second: list[Any] = []
    if streams or dlqs or ctls or beating:
        second = yield (
            [c for i in streams for c in (command("XLEN", keys[i].stream), command("XINFO", "GROUPS", keys[i].stream))]
            + [command("XLEN", keys[i].dlq) for i in dlqs]
            + [controls_call(keys[i]) for i in ctls]
            + [command("ZCOUNT", keys[i].beats, f"({now}", "+inf") for i in beating]
        )
    counts: dict[int, tuple[int, list[Any]]] = {
        i: (int_reply(second[2 * n]), second[2 * n + 1] or []) for n, i in enumerate(streams)
    }
    dlq_len = {i: int_reply(second[2 * len(streams) + n]) for n, i in enumerate(dlqs)}
    ctl = {i: parse_controls(second[2 * len(streams) + len(dlqs) + n]) for n, i in enumerate(ctls)}
    live = {i: int_reply(second[2 * len(streams) + len(dlqs) + len(ctls) + n]) for n, i in enumerate(beating)}
    out = []
    for i, q in enumerate(queues):
        length, groups = counts.get(i, (0, []))
        pending = consumers = 0
        for g in groups:
            info = reply_pairs(g)
            pending += int_reply(info.get("pending", 0))
            consumers += int_reply(info.get("consumers", 0))
        out.append(
            QueueSummary(
                queue=q,
                waiting=max(0, length - pending),
                pending=pending,
                delayed=int_reply(first[_PER_QUEUE * i + 1]),
                dlq=dlq_len.get(i, 0),
                specs=int_reply(first[_PER_QUEUE * i + 3]),
                paused_specs=int_reply(first[_PER_QUEUE * i + 4]),
                consumers=consumers,
                groups=len(groups),
                paused=ctl[i].paused if i in ctl else False,
                rate_limit=ctl[i].rate if i in ctl else None,
                concurrency=ctl[i].concurrency if i in ctl else None,
                prioritized=int_reply(first[_PER_QUEUE * i + 6]),
                workers=live.get(i, 0),
            )
        )
    return out


# ---- one job ----------------------------------------------------------------------------------
EVENTS_WINDOW = 1000
PAGE = 500
SEARCH_PAGES = 20


@dataclass(slots=True)
class JobDetails:
    queue: str
    id: str
    state: str  # completed, failed, cancelled, active, waiting, delayed or unknown
    name: str | None = None
    data: Any = None
    data_bytes: int | None = None  # size of the job's encoded data; None when no copy of the job was found
    created_at_ms: int | None = None
    attempt: int | None = None  # the latest run that started, 1-indexed as in events (latest_attempt); None: none yet
    run_at_ms: int | None = None  # delayed: when it becomes due
    entry_id: str | None = None  # stream entry, while waiting or running
    consumer: str | None = None  # running: the worker holding it
    deliveries: int | None = None
    idle_ms: int | None = None
    result: Any = None
    has_result: bool = False
    failure: dict[str, Any] | None = None  # the failure record: reason, detail, finished_at_ms, traceback...
    dlq: dict[str, Any] | None = None  # its DLQ entry: dlq_id, reason, detail and any other field
    progress: Any = None  # the latest progress its handler reported (a number or a small dict)
    origin: Origin | None = None  # the Airflow DAG run and task that enqueued it (core/origin.py)
    events: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    events_truncated: bool = False  # the window was full: older events may exist
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _failure_record(raw: Any) -> dict[str, Any] | None:
    """``[reason, detail, finished_ms, ...]`` (or a map) as a dict; extra items are kept."""
    if raw is None:
        return None
    try:
        record = decode_data(bytes(raw))
    except Exception as exc:  # noqa: BLE001 - a damaged record is shown, not raised
        return {"unreadable": f"{type(exc).__name__}: {exc}"}
    if isinstance(record, dict):
        return {str(k): v for k, v in record.items()}
    if isinstance(record, list):
        out: dict[str, Any] = dict(zip(("reason", "detail", "finished_at_ms"), record))
        for i, extra in enumerate(record[3:]):
            if isinstance(extra, dict):
                out.update({str(k): v for k, v in extra.items()})
            else:
                out["traceback" if i == 0 and isinstance(extra, str) else f"extra_{i}"] = extra
        return out
    return {"record": record}


def _envelope_of(payload: Any) -> Envelope | None:
    try:
        return decode_envelope(bytes(payload))
    except Exception:  # noqa: BLE001 - foreign or damaged entries do not match
        return None


# DLQ reasons given after a handler ran on that delivery (the envelope's attempt was not bumped)
_RAN_REASONS = frozenset((RETRIES_EXHAUSTED, UNRECOVERABLE, ROUTING_FAILED))


def latest_attempt(env_attempt: int, where: str, dlq_reason: str | None = None) -> int | None:
    """One attempt numbering for every page and command: the 1-indexed number of the latest run
    that started (the number events and worker logs carry), None when none did.  The envelope's
    ``attempt`` counts failed runs (0-indexed, wire protocol 4): a waiting or delayed copy was
    bumped by its last failure; a running copy, and a DLQ copy the worker re-encoded after a
    run, were not."""
    ran = env_attempt + 1 if where == "active" or (where == "failed" and dlq_reason in _RAN_REASONS) else env_attempt
    return ran or None


def _take(d: JobDetails, env: Envelope, name: str) -> None:
    d.name = d.name or name or None
    d.created_at_ms = env.created_at_ms
    d.attempt = env.attempt  # the raw count until job_details knows where the copy was (latest_attempt)
    d.data_bytes = len(env.inner)
    try:
        d.data = decode_data(env.inner)
    except Exception as exc:  # noqa: BLE001
        d.notes.append(f"the job's data does not decode: {exc}")


def job_details(  # noqa: C901, PLR0915 - one bounded search in a fixed order (delayed, stream, DLQ), each step reading the last
    queue: str,
    job_id: str,
    *,
    group: str = "default",
    events_window: int = EVENTS_WINDOW,
    search_pages: int = SEARCH_PAGES,
) -> Flow[JobDetails]:
    """Everything known about one job: a :class:`JobDetails`.  The events are the newest
    ``events_window`` of the queue's stream filtered by id; the stream, the delayed set and the
    DLQ are searched ``search_pages`` pages of 500 at most, from the job's creation time
    (ULID ids) or its last ``waiting`` / ``dlq`` event on.  ``JobNotFound`` when none of them
    holds a trace of the id (its message names the bounds that may have hidden one)."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > 1024:
        raise ConfigError("job id must be a non-empty str of at most 1024 characters")
    k = QueueKeys.for_queue(queue)
    d = JobDetails(queue=queue, id=job_id, state="unknown")
    result, failure, didx, rows, progress, origin = yield [
        command("GET", k.result(job_id)),
        command("GET", k.failure(job_id)),
        command("GET", k.didx(job_id)),
        command("XREVRANGE", k.events, "+", "-", "COUNT", events_window),
        command("GET", k.progress(job_id)),
        command("GET", k.origin(job_id)),
    ]
    d.progress = parse_progress(progress)
    d.origin = parse_origin(origin)
    d.events_truncated = len(rows or []) >= events_window
    hints: dict[str, int] = {}
    for entry_id, flat in reversed(rows or []):
        f = {key: str_reply(v) for key, v in reply_pairs(flat or []).items()}
        if f.get("id") != job_id:
            continue
        ts = int(f["ts"]) if f.get("ts", "").isdigit() else 0
        d.events.append({"event_id": str_reply(entry_id), **f})
        hints[f.get("e", "")] = ts
        d.name = d.name or f.get("n") or None
        if f.get("attempt", "").isdigit():
            d.attempt = max(d.attempt or 0, int(f["attempt"]))
    if d.events_truncated:
        d.notes.append(
            f"only the newest {events_window} events of the queue were read: older events of this "
            "job may exist (or were trimmed)"
        )
    if result is not None:
        d.has_result = True
        try:
            d.result = decode_data(bytes(result))
        except Exception as exc:  # noqa: BLE001
            d.notes.append(f"the stored result does not decode: {exc}")
    d.failure = _failure_record(failure)
    attempts_seen = d.attempt
    where = None
    # 1. delayed, by its index (a caller id) or by a bounded scan of the set
    member = didx
    if member is None and result is None:
        member = yield from _scan_delayed(k, job_id, search_pages, d)
    if member is not None:
        score = yield command("ZSCORE", k.delayed, member)
        if score is not None:
            try:
                name, env_raw = split_member(bytes(member))
            except CodecError:
                name, env_raw = "", b""
            env = _envelope_of(env_raw)
            if env is not None:
                _take(d, env, name)
            d.run_at_ms, where = int(float(score)), "delayed"
    # 2. the stream: waiting or running
    if where is None and result is None:
        start = hints.get("waiting") or ulid_ms(job_id)
        found = yield from _search_stream(k.stream, job_id, start, search_pages, d, "stream")
        if found is not None:
            entry_id, name, env, _fields = found
            _take(d, env, name)
            d.entry_id, where = entry_id, "waiting"
            groups = yield command("XINFO", "GROUPS", k.stream)  # XPENDING on a missing group is an error
            if any(str_reply(reply_pairs(g).get("name", b"")) == group for g in groups or []):
                pend = yield command("XPENDING", k.stream, group, entry_id, entry_id, 1)
                if pend:
                    _, consumer, idle, count = pend[0]
                    d.consumer, d.idle_ms, d.deliveries = str_reply(consumer), int_reply(idle), int_reply(count)
                    where = "active"
    # 3. the DLQ
    if where is None and (d.failure is not None or "dlq" in hints or result is None):
        start = hints.get("dlq") or (d.failure or {}).get("finished_at_ms")
        found = yield from _search_stream(
            k.dlq, job_id, start if isinstance(start, int) else None, search_pages, d, "DLQ"
        )
        if found is not None:
            entry_id, name, env, fields = found
            _take(d, env, name)
            d.dlq = {"dlq_id": entry_id, **{key: str_reply(v) for key, v in fields.items() if key not in ("d", "n")}}
            where = "failed"
    if where is not None and d.attempt is not None:
        d.attempt = latest_attempt(d.attempt, where, (d.dlq or {}).get("reason"))
    if attempts_seen is not None:
        d.attempt = max(d.attempt or 0, attempts_seen)
    last = d.events[-1]["e"] if d.events else None
    if where is not None:
        d.state = where
    elif result is not None or last == "completed":
        d.state = "completed"
    elif d.failure is not None or last == "dlq":
        d.state = "failed"
    elif last == "cancelled":
        d.state = "cancelled"
    elif last in ("active", "waiting"):
        d.state = last
        d.notes.append(f"not found where a {last} job would be within the search bounds; the state is its last event")
    if d.state == "unknown" and not d.events:
        bounds = f" ({'; '.join(d.notes)})" if d.notes else ""
        raise JobNotFound(f"no job {job_id!r} on queue {queue!r}: a wrong id or queue, or its records expired{bounds}")
    if d.state == "unknown":
        d.notes.append("its events say neither where it is nor how it ended: its records may have expired")
    return d


SKEW_MS = 60_000  # a stream entry's id is the server's clock; the job id's time is the producer's


# A job's entry is looked for inside Redis (``core/scan.py``): only entries holding its id cross
# the network, other fields cut to 4 KiB, at most 64 MiB read per look (issue 26).
JOB_SEARCH: dict[str, Any] = {"clip": 4096, "whole_d": True, "max_bytes": 64 * 1024 * 1024, "max_matches": 4}


def _search_stream(
    key: str, job_id: str, start_ms: int | None, pages: int, d: JobDetails, what: str
) -> Flow[tuple[str, str, Envelope, dict[str, Any]] | None]:
    """The first entry of ``key`` whose envelope has ``job_id``, looking at most ``pages`` x
    ``PAGE`` entries from ``start_ms`` (less a clock skew) on: ``(entry_id, name, envelope,
    fields)`` or None; a note says where a bound stopped the look."""
    start = "-" if start_ms is None else f"{max(0, start_ms - SKEW_MS)}-0"
    found = parse_scan((yield scan_call(key, start, count=pages * PAGE, needle=job_id.encode(), **JOB_SEARCH)))
    for entry_id, fields, _size in found.matches:
        env = _envelope_of(fields.get("d", b""))
        if env is not None and env.id == job_id:
            return entry_id, str_reply(fields.get("n", b"")), env, fields
    if not found.done:
        d.notes.append(
            f"the {what} was searched from {start} up to entry {found.last or '-'}: the job may be further on"
        )
    return None


def _scan_delayed(k: QueueKeys, job_id: str, pages: int, d: JobDetails) -> Flow[Any]:
    """The delayed member of ``job_id`` (its id is a substring of the member), by a ZSCAN of
    at most ``pages`` calls; None if not met."""
    cursor: Any = "0"
    pattern = "*" + glob_escape(job_id) + "*"
    for _ in range(pages):
        cursor, flat = yield command("ZSCAN", k.delayed, cursor, "MATCH", pattern, "COUNT", PAGE)
        flat = flat or []
        for i in range(0, len(flat), 2):
            try:
                _name, env_raw = split_member(bytes(flat[i]))
            except CodecError:
                continue
            env = _envelope_of(env_raw)
            if env is not None and env.id == job_id:
                return flat[i]
        if str_reply(cursor) == "0":
            return None
    d.notes.append(f"the delayed set was scanned {pages} x {PAGE} members: the job may be there still")
    return None
