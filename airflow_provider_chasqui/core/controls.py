"""A queue's flow controls, stored in Redis so every worker obeys them together (issue 24).

They live in one hash, ``{chasqui:<queue>}:controls`` (``QueueKeys.controls``), under the
queue's hash tag; a queue that never used a control has no such key.  Its fields:

* ``paused`` = ``1``: no worker starts a new job of the queue until it is gone
  (``Queue.pause()``/``resume()``).  Producers, the promoter and the scheduler go on.
* ``rate_max`` and ``rate_per_ms`` (``Queue.set_rate_limit()``): all workers together start
  at most ``rate_max`` jobs per fixed window of ``rate_per_ms`` (``lua/take_rate.lua`` grants
  them, on the server's clock); the jobs that must wait stay held by their worker, which
  sleeps until the next window.

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
    "take_rate_call",
    "block_calls",
    "controls_calls",
    "parse_controls_calls",
    "parse_take",
    "MAX_RATE_JOBS",
    "MAX_RATE_PER_MS",
]

PAUSED_FIELD = "paused"
RATE_MAX_FIELD, RATE_PER_FIELD = "rate_max", "rate_per_ms"
_ON = b"1"
_POSITIVE = re.compile(rb"[1-9][0-9]{0,11}")  # what take_rate.lua accepts: 1 .. 999,999,999,999
MAX_RATE_JOBS = 10**9
MAX_RATE_PER_MS = 366 * 86_400_000  # a year
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
    blocked_ms: int = 0  # a handler raised RateLimited: nothing starts for this long (the marker's TTL)


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
    if rmax is not None and rper is not None and _POSITIVE.fullmatch(rmax) and _POSITIVE.fullmatch(rper):
        rate = RateLimit(int(rmax), int(rper))
    return Controls(paused=paused, rate=rate) if paused or rate else NO_CONTROLS


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


def _count(what: str, value: object, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= most:
        raise ConfigError(f"{what} must be between 1 and {most:,}, got {value!r}")
    return value


def set_rate_limit(keys: QueueKeys, max_jobs: int, per_ms: int) -> Flow[None]:
    """All workers together start at most ``max_jobs`` jobs per ``per_ms`` milliseconds."""
    limit = RateLimit(_count("max_jobs", max_jobs, MAX_RATE_JOBS), _count("per_ms", per_ms, MAX_RATE_PER_MS))
    yield command("HSET", keys.controls, RATE_MAX_FIELD, limit.max_jobs, RATE_PER_FIELD, limit.per_ms)


def clear_rate_limit(keys: QueueKeys) -> Flow[None]:
    yield command("HDEL", keys.controls, RATE_MAX_FIELD, RATE_PER_FIELD)


def block_calls(keys: QueueKeys, ms: int) -> list[Call]:
    """Start nothing of the queue for ``ms`` (``RateLimited``): the marker ``:blocked`` with that
    TTL, or its TTL raised to it; a shorter block never cuts a longer one (``PEXPIRE GT``)."""
    return [command("SET", keys.blocked, _ON, "PX", ms, "NX"), command("PEXPIRE", keys.blocked, ms, "GT")]


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


def take_rate_call(keys: QueueKeys, want: int) -> Call:
    """``take_rate.lua``: how many of ``want`` jobs may start now, and else how long to wait."""
    return script_call("take_rate", (keys.controls, keys.rate), (want,))


def parse_take(reply: object, want: int) -> tuple[int, int]:
    """``(granted, wait_ms)`` of ``take_rate``'s reply, bounded to ``0..want`` and ``0..MAX_RATE_PER_MS``."""
    if not isinstance(reply, list) or len(reply) != 2:
        return want, 0
    granted, wait = int_reply(reply[0]), int_reply(reply[1])
    return max(0, min(granted, want)), max(0, min(wait, MAX_RATE_PER_MS))
