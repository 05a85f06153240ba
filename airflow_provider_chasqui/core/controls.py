"""A queue's flow controls, stored in Redis so every worker obeys them together (issue 24).

They live in one hash, ``{chasqui:<queue>}:controls`` (``QueueKeys.controls``), under the
queue's hash tag; a queue that never used a control has no such key.  Its fields:

* ``paused`` = ``1``: no worker starts a new job of the queue until it is gone
  (``Queue.pause()``/``resume()``).  Producers, the promoter and the scheduler go on.
* ``rate_max`` and ``rate_per_ms`` (``Queue.set_rate_limit()``): all workers together start
  at most ``rate_max`` jobs per fixed window of ``rate_per_ms`` (``lua/take_starts.lua`` grants
  them, on the server's clock); the jobs that must wait stay held by their worker, which
  sleeps until the next window.
* ``concurrency`` (``Queue.set_concurrency()``): at most that many jobs of the queue run at
  once over all workers.  Each started job holds a slot, a member of the sorted set
  ``{chasqui:<queue>}:running`` (``QueueKeys.running``) scored with the end of its lease; the
  worker renews it with the lease (``lua/renew_slots.lua``) and removes it when the job
  settles, and a dead worker's slot is purged one lease after its last renewal.
* ``prio_seq`` (``lua/add_prioritized.lua``, ``core/priorities.py``): the sequence of the jobs
  added with a priority; present once the queue used one, it tells the workers to move the
  most urgent of them into the stream when it runs dry.
* ``grouped`` (``lua/add_grouped.lua``, ``core/groups.py``): jobs were added with a group; the
  workers serve the groups' turns when the stream runs dry.
* ``timeouts`` (``core/running.py``): jobs were added with their own ``timeout_ms``; the
  workers read each batch's job timeouts.
* ``cancels`` (``core/running.py``): jobs of the queue were cancelled; the workers look up the
  jobs they read and run in ``{chasqui:<queue>}:cancel``.

Beside the hash, the marker ``{chasqui:<queue>}:blocked`` (``QueueKeys.blocked``): while it
lives, nothing of the queue starts; a handler that raises ``RateLimited(retry_after_ms)`` sets
it (its TTL), and its own job goes back without counting an attempt.

How a worker obeys them (the 100 ms cache, holding what may not start yet) is
``engine/flow_gate.py``.  Anything but the exact values this module writes (a hostile or
foreign value, a key of another type) reads as "no control".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import ConfigError, RateLimited
from .calls import Call, Flow, command, int_reply, script_call
from .keys import QueueKeys

__all__ = [
    "Controls",
    "NO_CONTROLS",
    "RateLimit",
    "controls_call",
    "parse_controls",
    "pause",
    "resume",
    "read_controls",
    "set_rate_limit",
    "clear_rate_limit",
    "take_starts_call",
    "renew_slots_call",
    "free_slots_call",
    "set_concurrency",
    "clear_concurrency",
    "block_calls",
    "controls_calls",
    "parse_controls_calls",
    "parse_take",
    "MAX_RATE_JOBS",
    "MAX_RATE_PER_MS",
    "MAX_CONCURRENCY",
    "sum_rate_limits",
    "check_count",
    "positive_int",
]

PAUSED_FIELD = "paused"
RATE_MAX_FIELD, RATE_PER_FIELD = "rate_max", "rate_per_ms"
CONCURRENCY_FIELD = "concurrency"
PRIORITY_SEQ_FIELD = "prio_seq"  # written by lua/add_prioritized.lua: the queue uses priorities
GROUPED_FIELD = "grouped"  # written by lua/add_grouped.lua: the queue has job groups
# workers act on the controls as read at most this long before a batch is handed out
# (engine/flow_gate.py); a producer that sets a field workers must see for the very job it adds
# (``timeouts``) waits this long (plus a margin) after setting it the first time
CONTROLS_MAX_AGE_MS = 100
TIMEOUTS_FIELD = "timeouts"  # written by core/running.py: jobs may carry their own timeout
CANCELS_FIELD = "cancels"  # written by core/running.py: jobs may have been cancelled
_ON = b"1"
_POSITIVE = re.compile(rb"[1-9][0-9]{0,11}")  # what take_starts.lua accepts: 1 .. 999,999,999,999
MAX_RATE_JOBS = 10**9
MAX_RATE_PER_MS = 366 * 86_400_000  # a year
MAX_CONCURRENCY = 10**6
MAX_BLOCK_MS = RateLimited.MAX_MS  # a longer TTL on the marker (written by hand) counts as a day


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``max_jobs`` starts per fixed window of ``per_ms`` milliseconds, all workers together."""

    max_jobs: int
    per_ms: int


@dataclass(frozen=True, slots=True)
class Controls:
    """What the controls hash says, as the intake obeys it."""

    paused: bool = False
    rate: RateLimit | None = None
    concurrency: int | None = None  # at most this many running at once, all workers together
    prioritized: bool = False  # jobs were added with a priority (core/priorities.py): look at that set
    grouped: bool = False  # jobs were added with a group (core/groups.py): serve the groups' turns
    blocked_ms: int = 0  # a handler raised RateLimited: nothing starts for this long (the marker's TTL)
    timeouts: bool = False  # jobs were added with their own timeout (core/running.py): read them
    cancels: bool = False  # jobs were cancelled (core/running.py): look the batches up


NO_CONTROLS = Controls()


def controls_call(keys: QueueKeys) -> Call:
    """``HGETALL`` of the controls hash: every control in one reply."""
    return command("HGETALL", keys.controls)


def parse_controls(reply: object) -> Controls:
    """``HGETALL``'s reply (a flat list or a dict) as :class:`Controls`; anything unexpected
    (another key type's error, foreign values) is no control."""
    if isinstance(reply, dict):
        fields = {(k.encode() if isinstance(k, str) else k): v for k, v in reply.items()}
    elif isinstance(reply, list):
        fields = dict(zip(reply[::2], reply[1::2]))
    else:
        return NO_CONTROLS
    if not fields:
        return NO_CONTROLS
    paused = _raw(fields.get(PAUSED_FIELD.encode())) == _ON
    rmax, rper = _raw(fields.get(RATE_MAX_FIELD.encode())), _raw(fields.get(RATE_PER_FIELD.encode()))
    rate = None
    max_jobs, per_ms = positive_int(rmax), positive_int(rper)
    if max_jobs is not None and per_ms is not None:
        rate = RateLimit(max_jobs, per_ms)
    concurrency = positive_int(fields.get(CONCURRENCY_FIELD.encode()))
    prioritized = PRIORITY_SEQ_FIELD.encode() in fields
    grouped = GROUPED_FIELD.encode() in fields
    timeouts = TIMEOUTS_FIELD.encode() in fields
    cancels = CANCELS_FIELD.encode() in fields
    if not (paused or rate or concurrency or prioritized or grouped or timeouts or cancels):
        return NO_CONTROLS
    return Controls(
        paused=paused,
        rate=rate,
        concurrency=concurrency,
        prioritized=prioritized,
        grouped=grouped,
        timeouts=timeouts,
        cancels=cancels,
    )


def positive_int(value: object) -> int | None:
    """A stored limit as the Lua scripts read it: 1 to 12 digits, no sign, no leading zero;
    anything else (hostile, foreign) is no limit."""
    raw = _raw(value)
    return int(raw) if raw is not None and _POSITIVE.fullmatch(raw) else None


def _raw(value: object) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return value if isinstance(value, bytes) else None


def pause(keys: QueueKeys) -> Flow[None]:
    """Stop every worker starting new jobs of the queue (running ones finish)."""
    yield command("HSET", keys.controls, PAUSED_FIELD, _ON)


def resume(keys: QueueKeys) -> Flow[None]:
    """Let the workers start jobs again."""
    yield command("HDEL", keys.controls, PAUSED_FIELD)


def read_controls(keys: QueueKeys) -> Flow[Controls]:
    """The controls as the workers see them (``is_paused()``): a key of another type is none,
    as it is for them."""
    kind = yield command("TYPE", keys.controls)
    if kind not in (b"hash", "hash"):
        return NO_CONTROLS
    return parse_controls((yield controls_call(keys)))


def check_count(what: str, value: object, most: int) -> int:
    """A limit as a user gives it: an int from 1 to ``most`` (else ``ConfigError`` naming ``what``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= most:
        raise ConfigError(f"{what} must be between 1 and {most:,}, got {value!r}")
    return value


def set_rate_limit(keys: QueueKeys, max_jobs: int, per_ms: int) -> Flow[None]:
    """All workers together start at most ``max_jobs`` jobs per ``per_ms`` milliseconds."""
    limit = RateLimit(check_count("max_jobs", max_jobs, MAX_RATE_JOBS), check_count("per_ms", per_ms, MAX_RATE_PER_MS))
    yield command("HSET", keys.controls, RATE_MAX_FIELD, limit.max_jobs, RATE_PER_FIELD, limit.per_ms)


def clear_rate_limit(keys: QueueKeys) -> Flow[None]:
    yield command("HDEL", keys.controls, RATE_MAX_FIELD, RATE_PER_FIELD)


def sum_rate_limits(limits: list[RateLimit | None]) -> RateLimit | None:
    """The limits of a sharded queue's shards as one: their sum when every shard has one and
    all count the same window, else None (set by hand to something the whole does not obey)."""
    if not limits or any(lim is None for lim in limits):
        return None
    windows = {lim.per_ms for lim in limits if lim is not None}
    if len(windows) != 1:
        return None
    return RateLimit(sum(lim.max_jobs for lim in limits if lim is not None), windows.pop())


def set_concurrency(keys: QueueKeys, n: int) -> Flow[None]:
    """At most ``n`` jobs of the queue run at once, all workers together."""
    yield command("HSET", keys.controls, CONCURRENCY_FIELD, check_count("concurrency", n, MAX_CONCURRENCY))


def clear_concurrency(keys: QueueKeys) -> Flow[None]:
    """No concurrency limit (the slots still held are dropped as their jobs settle)."""
    yield command("HDEL", keys.controls, CONCURRENCY_FIELD)


def block_calls(keys: QueueKeys, ms: int, marker: str | None = None) -> list[Call]:
    """Start nothing of the queue (or of a group: its ``marker``) for ``ms`` (``RateLimited``):
    the marker ``:blocked`` with that TTL, or its TTL raised to it; a shorter block never cuts a
    longer one (``PEXPIRE GT``)."""
    key = marker or keys.blocked
    return [command("SET", key, _ON, "PX", ms, "NX"), command("PEXPIRE", key, ms, "GT")]


def controls_calls(keys: QueueKeys) -> list[Call]:
    """What the intake reads, in one round trip: the controls hash and the block's TTL."""
    return [command("PTTL", keys.blocked), controls_call(keys)]


def parse_controls_calls(replies: list[object]) -> Controls:
    """:func:`controls_calls`' replies as :class:`Controls` (a negative TTL: no block)."""
    found = parse_controls(replies[1])
    ttl = replies[0]
    blocked = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else 0
    if not blocked:
        return found
    return replace(found, blocked_ms=min(blocked, MAX_BLOCK_MS))


def take_starts_call(keys: QueueKeys, entry_ids: list[bytes], lease_ms: int) -> Call:
    """``take_starts.lua``: how many of ``entry_ids`` (a prefix) may start now under the
    concurrency and rate limits, and else how long the rate limit says to wait."""
    return script_call("take_starts", (keys.controls, keys.rate, keys.running), (len(entry_ids), lease_ms, *entry_ids))


def renew_slots_call(keys: QueueKeys, entry_ids: list[bytes], lease_ms: int, running: str | None = None) -> Call:
    """``renew_slots.lua``: the slots of ``entry_ids`` (in the queue's running set, or in
    ``running``: a group's) last one more lease."""
    return script_call("renew_slots", (running or keys.running,), (lease_ms, *entry_ids))


def free_slots_call(keys: QueueKeys, entry_ids: list[bytes], running: str | None = None) -> Call:
    """The slots of settled entries, freed (sent with the settling writes)."""
    return command("ZREM", running or keys.running, *entry_ids)


def parse_take(reply: object, want: int) -> tuple[int, int, bool, int]:
    """``(granted, wait_ms, slotted, server_ms)`` of ``take_starts``' reply, bounded to
    ``0..want`` and ``0..MAX_RATE_PER_MS``; ``slotted``: the granted jobs hold concurrency
    slots; ``server_ms``: the server's clock at the grant (0: no limit applied).  A reply of
    another shape (a foreign script) grants everything."""
    if not isinstance(reply, list) or len(reply) != 4:
        return want, 0, False, 0
    granted, wait = int_reply(reply[0]), int_reply(reply[1])
    return max(0, min(granted, want)), max(0, min(wait, MAX_RATE_PER_MS)), int_reply(reply[2]) == 1, int_reply(reply[3])
