"""Read-only views of queues for people, scripts and dashboards: a queue's snapshot
(``chasqui inspect``/``watch``) and every queue with its counts (``chasqui queues``); one
job's whole story (``chasqui job show``) is ``core/job_details.py``.

:func:`snapshot`: one flow, two round trips: the counters in one pipeline, then consumer details only when
the stream and its group exist (XINFO on a missing group is an error, not an empty list).
Corrupt data renders instead of failing the snapshot: a spec key that is not UTF-8 shows
escaped, a score that is no instant (+-inf) shows as Redis' text of it.

:func:`list_queues`: a cursor SCAN of ``{chasqui:*`` (never KEYS), capped in calls, then the
counts of every queue found in one pipeline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError, ConfigTypeError
from .calls import Flow, command, int_reply, reply_pairs, str_reply
from .codec import U64_MAX, utf8_text
from .codec import now_ms as current_ms
from .controls import NO_CONTROLS, RateLimit, controls_call, parse_controls
from .counts import counts_call, parse_counts
from .event_follow import after
from .key_types import Reads, read_types, spoiled_keys
from .keys import QueueKeys, check_consumer_name
from .liveness import REAP_IDLE_LEASES, WorkerRecord, live_consumers, read_workers
from .spec_reads import show_key

__all__ = [
    "QueueSnapshot",
    "ConsumerInfo",
    "snapshot",
    "QueueSummary",
    "QueueListing",
    "list_queues",
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
    # keys holding another type than their role needs (key -> the type found): read as empty
    spoiled: dict[str, str] = field(default_factory=dict)

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


def group_row(flat: list[Any]) -> dict[str, Any]:
    info = reply_pairs(flat or [])
    return {
        "name": str_reply(info.get("name", b"")),
        "pending": int_reply(info.get("pending", 0)),
        "consumers": int_reply(info.get("consumers", 0)),
        "last_delivered": str_reply(info.get("last-delivered-id", b"0-0")),
        "lag": None if info.get("lag") is None else int_reply(info["lag"]),
    }


JOB_GROUP_ROWS = 10  # the job groups a snapshot details (the next ones in turn)


def _group_rows(k: QueueKeys, names: list[str], spoiled: dict[str, str]) -> Flow[list[tuple[str, int, int]]]:
    """(group, waiting jobs, running jobs under its limit) of each named job group; a group key
    of another type counts as empty and is added to ``spoiled``."""
    want = {key: t for g in names for key, t in ((k.group_jobs(g), "list"), (k.group_running(g), "zset"))}
    types = yield from read_types(list(want))
    spoiled.update(spoiled_keys(types, want))
    reads = Reads(types)
    for g in names:
        reads.add("w" + g, k.group_jobs(g), "list", command("LLEN", k.group_jobs(g)))
        reads.add("r" + g, k.group_running(g), "zset", command("ZCARD", k.group_running(g)))
    got = yield from reads.run()
    return [(g, int_reply(got.get("w" + g, 0)), int_reply(got.get("r" + g, 0))) for g in names]


def _counters(
    k: QueueKeys, group: str, now_ms: int, next_fires: int
) -> Flow[tuple[Reads, dict[str, str], dict[str, Any]]]:
    """The snapshot's counters: the keys' types, then the job counts (one instant's:
    ``core/counts.py``) and each other count whose key holds its type."""
    want = {
        k.stream: "stream",
        k.delayed: "zset",
        k.dlq: "stream",
        k.repeat: "zset",
        k.repeat_paused: "zset",
        k.repeat_quarantine: "hash",
        k.promoter_lock: "string",
        k.scheduler_lock: "string",
        k.controls: "hash",
        k.running: "zset",
        k.prioritized: "zset",
        k.groups: "zset",
        k.events: "stream",  # not read here: its readers (the dashboard's rates) skip it when spoiled
    }
    types = yield from read_types(list(want))
    spoiled = spoiled_keys(types, want)
    reads = Reads(types)
    reads.calls["counts"] = counts_call(k, group)
    reads.add("oldest", k.delayed, "zset", command("ZRANGE", k.delayed, 0, 0, "WITHSCORES"))
    reads.add("overdue", k.delayed, "zset", command("ZCOUNT", k.delayed, "-inf", now_ms))
    reads.add("specs", k.repeat, "zset", command("ZCARD", k.repeat))
    reads.add("fires", k.repeat, "zset", command("ZRANGE", k.repeat, 0, max(0, next_fires - 1), "WITHSCORES"))
    reads.add("paused", k.repeat_paused, "zset", command("ZCARD", k.repeat_paused))
    reads.add("quarantined", k.repeat_quarantine, "hash", command("HLEN", k.repeat_quarantine))
    reads.add("promoter", k.promoter_lock, "string", command("GET", k.promoter_lock))
    reads.add("scheduler", k.scheduler_lock, "string", command("GET", k.scheduler_lock))
    reads.add("job_groups", k.groups, "zset", command("ZCARD", k.groups))
    got = yield from reads.run()
    return reads, spoiled, got


def snapshot(queue: str, *, group: str = "default", now_ms: int, next_fires: int = 5) -> Flow[QueueSnapshot]:
    """A :class:`QueueSnapshot`: the keys' types in one pipeline and the counters in a second
    (the job counts one instant's, ``core/counts.py``; a key of another type is named in
    ``spoiled`` and reads as empty: core/key_types.py), then
    the groups, the group's consumers and the oldest waiting entry only where they exist (XINFO
    on a missing stream or group is an error, not an empty list)."""
    k = QueueKeys.for_queue(queue)
    check_consumer_name(group)
    reads, spoiled, got = yield from _counters(k, group, now_ms, next_fires)
    counts = parse_counts(got["counts"])
    oldest, fires = got.get("oldest") or [], got.get("fires") or []
    promoter, scheduler = got.get("promoter"), got.get("scheduler")
    controls = parse_controls((yield controls_call(k))) if reads.holds(k.controls, "hash") else NO_CONTROLS
    group_rows: list[tuple[str, int, int]] = []
    if int_reply(got.get("job_groups", 0)):
        names = [str_reply(g) for g in (yield command("ZRANGE", k.groups, 0, JOB_GROUP_ROWS - 1)) or []]
        group_rows = yield from _group_rows(k, names, spoiled)
    held = 0  # slots not past their lease (a dead worker's lapse; take_starts.lua purges them)
    if controls.concurrency is not None and reads.holds(k.running, "zset"):
        held = int_reply((yield command("ZCOUNT", k.running, f"({now_ms}", "+inf")))
    workers = yield from read_workers(k, now_ms)  # another type (hostile): none, consumers judged by idle
    live = {w.consumer: w.live for w in workers}
    consumers: list[ConsumerInfo] = []
    exists = reads.holds(k.stream, "stream")
    groups = [group_row(g) for g in ((yield command("XINFO", "GROUPS", k.stream)) if exists else []) or []]
    mine = next((g for g in groups if g["name"] == group), None)
    if mine is not None:
        for row in (yield command("XINFO", "CONSUMERS", k.stream, group)) or []:
            info = reply_pairs(row)
            name = str_reply(info["name"])
            consumers.append(
                ConsumerInfo(name, int_reply(info.get("pending", 0)), int_reply(info.get("idle", 0)), live.get(name))
            )
    waiting = counts.waiting
    oldest_waiting = None
    if counts.stream:
        delivered = mine["last_delivered"] if mine is not None else "0-0"
        start = after(delivered) if delivered != "0-0" else "-"
        first = (yield command("XRANGE", k.stream, start, "+", "COUNT", 1)) if start is not None else None
        if first:
            oldest_waiting = max(0, now_ms - int(str_reply(first[0][0]).partition("-")[0] or 0))
    first_due = score_ms(oldest[1]) if oldest else None
    pairs = [(show_key(fires[i]), score_ms(fires[i + 1])) for i in range(0, len(fires), 2)]
    return QueueSnapshot(
        queue=queue,
        stream=counts.stream,
        pending=counts.active,
        delayed=counts.delayed,
        oldest_delayed_lag_ms=max(0, now_ms - first_due) if isinstance(first_due, int) else None,
        dlq=counts.failed,
        specs=int_reply(got.get("specs", 0)),
        paused_specs=int_reply(got.get("paused", 0)),
        next_fires=pairs,
        promoter_leader=str_reply(promoter) if promoter else None,
        scheduler_leader=str_reply(scheduler) if scheduler else None,
        group_exists=mine is not None,
        consumers=consumers,
        workers=workers,
        waiting=waiting,
        oldest_waiting_ms=oldest_waiting,
        overdue=int_reply(got.get("overdue", 0)),
        quarantined=int_reply(got.get("quarantined", 0)),
        groups=groups,
        paused=controls.paused,
        rate_limit=controls.rate,
        concurrency=controls.concurrency,
        slots_held=held,
        prioritized=counts.prioritized,
        job_groups=int_reply(got.get("job_groups", 0)),
        job_group_rows=group_rows,
        spoiled=spoiled,
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
    spoiled: dict[str, str] = field(default_factory=dict)  # keys of another type (key -> type): read as empty

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


def scan_cursor(cursor: object) -> str:
    """A SCAN cursor as Redis takes it: an int from 0 to 2**64 - 1, or its decimal digits (what
    a listing printed).  Anything else was Redis' bare "invalid cursor", or (``-1``) taken as
    another cursor than the one meant."""
    if isinstance(cursor, bool) or not isinstance(cursor, (int, str)):
        raise ConfigTypeError(f"cursor must be the cursor a listing returned (digits), got {type(cursor).__name__}")
    text = str(cursor)
    if not (text.isascii() and text.isdigit() and len(text) <= 20 and int(text) <= U64_MAX):
        raise ConfigError(f"cursor must be the cursor a listing returned (0 to {U64_MAX} in digits), got {text[:40]!r}")
    return str(int(text))


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
    utf8_text(match, "match")
    pattern = "{chasqui:" + match + "}*"
    names: set[str] = set()
    calls = 0
    cursor = scan_cursor(cursor)
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


# The keys of a queue ``queue_summaries`` reads, and the type each must hold.
_SUMMARY_KEYS = (
    ("stream", "stream"),
    ("delayed", "zset"),
    ("dlq", "stream"),
    ("repeat", "zset"),
    ("repeat_paused", "zset"),
    ("controls", "hash"),
    ("prioritized", "zset"),
    ("beats", "zset"),
)


def queue_summaries(queues: list[str]) -> Flow[list[QueueSummary]]:
    """The counts of each queue, in two pipelines whatever their number: the keys' types, then
    the counts of the keys holding their type (another type is named in ``spoiled``)."""
    if not queues:
        return []
    keys = [QueueKeys.for_queue(q) for q in queues]
    want = [{getattr(k, role): t for role, t in _SUMMARY_KEYS} for k in keys]
    types = yield from read_types([key for w in want for key in w])
    now = current_ms()
    reads = Reads(types)
    for i, k in enumerate(keys):
        reads.add(f"{i} stream", k.stream, "stream", command("XLEN", k.stream))
        reads.add(f"{i} groups", k.stream, "stream", command("XINFO", "GROUPS", k.stream))
        reads.add(f"{i} delayed", k.delayed, "zset", command("ZCARD", k.delayed))
        reads.add(f"{i} dlq", k.dlq, "stream", command("XLEN", k.dlq))
        reads.add(f"{i} specs", k.repeat, "zset", command("ZCARD", k.repeat))
        reads.add(f"{i} paused", k.repeat_paused, "zset", command("ZCARD", k.repeat_paused))
        reads.add(f"{i} controls", k.controls, "hash", controls_call(k))
        reads.add(f"{i} prioritized", k.prioritized, "zset", command("ZCARD", k.prioritized))
        reads.add(f"{i} workers", k.beats, "zset", command("ZCOUNT", k.beats, f"({now}", "+inf"))
    got = yield from reads.run()
    out = []
    for i, q in enumerate(queues):
        pending = consumers = 0
        groups = got.get(f"{i} groups") or []
        for g in groups:
            info = reply_pairs(g)
            pending += int_reply(info.get("pending", 0))
            consumers += int_reply(info.get("consumers", 0))
        ctl = parse_controls(got[f"{i} controls"]) if f"{i} controls" in got else NO_CONTROLS
        out.append(
            QueueSummary(
                queue=q,
                waiting=max(0, int_reply(got.get(f"{i} stream", 0)) - pending),
                pending=pending,
                delayed=int_reply(got.get(f"{i} delayed", 0)),
                dlq=int_reply(got.get(f"{i} dlq", 0)),
                specs=int_reply(got.get(f"{i} specs", 0)),
                paused_specs=int_reply(got.get(f"{i} paused", 0)),
                consumers=consumers,
                groups=len(groups),
                paused=ctl.paused,
                rate_limit=ctl.rate,
                concurrency=ctl.concurrency,
                prioritized=int_reply(got.get(f"{i} prioritized", 0)),
                workers=int_reply(got.get(f"{i} workers", 0)),
                spoiled=spoiled_keys(types, want[i]),
            )
        )
    return out
