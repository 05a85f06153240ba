"""Worker identity and liveness (issue 28), sans I/O: heartbeats every viewer reads.

``XINFO CONSUMERS`` cannot tell a live idle worker from a dead one on Redis before 7.2: its
``idle`` counts from the consumer's last *successful* read, so a healthy worker blocked on an
empty queue looks as idle as a dead one (and ``inactive`` does not exist there).  So each
worker beats, with its lease renewals (ten times per lease, and from the lease guard's thread
while its event loop is blocked):

* ``{chasqui:<queue>}:beats`` (``QueueKeys.beats``), a sorted set: the consumer name scored
  with the time until which its worker counts as alive (the beat plus ``LIVE_LEASES`` leases);
* ``{chasqui:<queue>}:worker:<consumer>`` (``QueueKeys.worker``): who it is, as JSON (host,
  pid, version, handlers, concurrency, started, last beat, lease, health), expiring
  ``REAP_IDLE_LEASES + 1`` leases after the last beat.

A consumer with a live beat is never reaped (``lua/reap_consumers.lua``), whatever ``idle``
says; the reaper drops the beats of workers dead for the reap age.  A clean stop removes both.
Consumer names and the identity record are made in ``engine/identity.py``.  Consumers without
a beat (ChasquiMQ workers, an older version of this package) are judged by
``idle`` as before.  :func:`live_consumers` is the one rule the CLI, the dashboard and the
metrics share.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .calls import Call, Flow, command
from .keys import QueueKeys
from .text import age

__all__ = [
    "LIVE_LEASES",
    "REAP_IDLE_LEASES",
    "WorkerRecord",
    "beat_calls",
    "leave_calls",
    "workers_calls",
    "parse_workers",
    "parse_beats",
    "read_workers",
    "identity_call",
    "live_consumers",
    "WORKER_COLUMNS",
    "worker_row",
]

LIVE_LEASES = 2  # a worker counts as alive this long after its last beat
REAP_IDLE_LEASES = 10  # a consumer idle (and unbeaten) this long, with nothing pending, is removed
MAX_WORKERS_LISTED = 1000  # a listing reads at most this many beats (the most recent)
MAX_HANDLERS = 50  # handler names an identity lists


def beat_calls(
    keys: QueueKeys, consumer: str, record: dict[str, Any], lease_ms: int, now: int, ok: bool, left_running: int = 0
) -> list[Call]:
    """One beat: the live-until score and the identity, for one pipeline.  ``left_running``:
    handlers still running whose job was ended without them (``Worker.left_running``)."""
    body = json.dumps(
        {**record, "beat_ms": now, "ok": ok, "left_running": left_running}, separators=(",", ":"), default=str
    )
    return [
        command("ZADD", keys.beats, now + LIVE_LEASES * lease_ms, consumer),
        command("SET", keys.worker(consumer), body, "PX", (REAP_IDLE_LEASES + 1) * lease_ms),
    ]


def leave_calls(keys: QueueKeys, consumer: str) -> list[Call]:
    """A clean stop: the worker is gone at once, not two leases later."""
    return [command("ZREM", keys.beats, consumer), command("DEL", keys.worker(consumer))]


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker as its beats describe it.  ``live``: its last beat is recent (``LIVE_LEASES``)."""

    consumer: str
    live: bool
    live_until_ms: int
    host: str = ""
    pid: int | None = None
    version: str = ""
    handlers: list[str] = field(default_factory=list)
    concurrency: int | None = None
    started_ms: int | None = None
    beat_ms: int | None = None
    lease_ms: int | None = None
    ok: bool | None = None
    kind: str = ""
    left_running: int | None = None  # handlers running on after their job ended (None: not said)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


WORKER_COLUMNS = (
    "worker",
    "state",
    "host",
    "pid",
    "version",
    "kind",
    "handlers",
    "concurrency",
    "up",
    "last beat",
    "health",
    "left running",
)


def worker_row(w: WorkerRecord, now: int) -> tuple[str, ...]:
    """A worker's cells under :data:`WORKER_COLUMNS`, as every viewer shows them (``chasqui
    workers`` and ``inspect``, the dashboard's Workers page); the viewer escapes them."""
    return (
        w.consumer,
        "alive" if w.live else "gone",
        w.host or "-",
        "-" if w.pid is None else str(w.pid),
        w.version or "-",
        w.kind or "-",
        ", ".join(w.handlers) or "-",
        "-" if w.concurrency is None else str(w.concurrency),
        age(now - w.started_ms) if w.started_ms else "-",
        age(now - w.beat_ms) + " ago" if w.beat_ms else "-",
        {True: "ok", False: "unhealthy", None: "-"}[w.ok],
        "-" if w.left_running is None else str(w.left_running),
    )


def workers_calls(keys: QueueKeys) -> Call:
    """The newest ``MAX_WORKERS_LISTED`` beats; their identities follow with :func:`identity_call`."""
    return command("ZRANGE", keys.beats, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, MAX_WORKERS_LISTED, "WITHSCORES")


def identity_call(keys: QueueKeys, consumers: list[str]) -> Call:
    return command("MGET", *[keys.worker(c) for c in consumers])


def read_workers(keys: QueueKeys, now: int) -> Flow[list[WorkerRecord]]:
    """The workers that beat on this queue, newest first (a beats key of another type: none)."""
    kind = yield command("TYPE", keys.beats)
    if (kind.decode() if isinstance(kind, bytes) else str(kind)) != "zset":
        return []
    beats = parse_beats((yield workers_calls(keys)))
    if not beats:
        return []
    return parse_workers(beats, (yield identity_call(keys, [name for name, _ in beats])), now)


def parse_beats(reply: object) -> list[tuple[str, int]]:
    """``(consumer, live until ms)`` from :func:`workers_calls`' reply; junk entries skipped."""
    if not isinstance(reply, list):
        return []
    out = []
    for i in range(0, len(reply) - 1, 2):
        name, score = reply[i], reply[i + 1]
        try:
            until = int(float(score))
        except (TypeError, ValueError, OverflowError):
            continue
        if isinstance(name, bytes):
            out.append((name.decode("utf-8", "replace"), until))
    return out


def parse_workers(beats: list[tuple[str, int]], identities: object, now: int) -> list[WorkerRecord]:
    """The records of ``beats``, with what their identity keys say (junk fields are dropped)."""
    raws = identities if isinstance(identities, list) else [None] * len(beats)
    out = []
    for (name, until), raw in zip(beats, raws):
        info: dict[str, Any] = {}
        if isinstance(raw, bytes):
            try:
                loaded = json.loads(raw)
                info = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                info = {}
        out.append(
            WorkerRecord(
                consumer=name,
                live=until > now,
                live_until_ms=until,
                host=_clip(str(info.get("host", "")), 100),
                pid=_int(info.get("pid")),
                version=_clip(str(info.get("version", "")), 50),
                handlers=[_clip(str(h), 256) for h in info.get("handlers", [])[: MAX_HANDLERS + 1]]
                if isinstance(info.get("handlers"), list)
                else [],
                concurrency=_int(info.get("concurrency")),
                started_ms=_int(info.get("started_ms")),
                beat_ms=_int(info.get("beat_ms")),
                lease_ms=_int(info.get("lease_ms")),
                ok=info["ok"] if isinstance(info.get("ok"), bool) else None,
                kind=_clip(str(info.get("kind", "")), 20),
                left_running=_count(info.get("left_running")),
            )
        )
    return out


def _clip(text: str, limit: int) -> str:
    return text[:limit]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: object) -> int | None:
    n = _int(value)
    return n if n is not None and n >= 0 else None


def live_consumers(consumers: list[Any], workers: list[WorkerRecord], reap_idle_ms: int) -> int:
    """How many consumers are alive: those whose worker beats, and those without beats (other
    clients) whose ``idle`` is below the reap age -- never a beating worker judged by ``idle``."""
    beating = {w.consumer: w.live for w in workers}
    return sum(beating.get(c.name, c.idle_ms < reap_idle_ms) for c in consumers)
