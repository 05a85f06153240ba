"""Job groups (tenants) with fair turns and per-group limits (issue 24): the sans-I/O rules.

A job added with ``group="customer-42"`` does not enter the stream at once: it waits in its
group's list ``{chasqui:<queue>}:group:<group>``, and the group joins the turn of groups with
waiting jobs, ``{chasqui:<queue>}:groups`` (``lua/add_grouped.lua``).  A worker whose group has
read everything else in the stream (and every prioritized job) moves jobs to the stream's tail
one group at a time, round robin (``lua/take_grouped.lua``), so a group's backlog delays another
group's next job by at most one turn.  Each moved entry carries its group in the field ``g``.

Per-group limits (``Queue.set_group_limits``) live in the hash ``:group_limits``: a concurrency
limit (a slot per running job in ``:grun:<group>``, as the queue's own slots) and a rate limit
(fixed windows in ``:grate:<group>``), for one group or for every group.  A handler that raises
``RateLimited`` in a grouped job blocks only its group (``:gblocked:<group>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .calls import Call, Flow, command, script_call
from .codec import utf8_text
from .controls import MAX_CONCURRENCY, MAX_RATE_JOBS, MAX_RATE_PER_MS, block_calls, check_count, positive_int
from .keys import QueueKeys

__all__ = [
    "MAX_GROUP_BYTES",
    "GroupLimits",
    "check_group",
    "add_grouped_call",
    "take_grouped_call",
    "set_group_limits",
    "get_group_limits",
    "clear_group_limits",
    "requeue_grouped_calls",
]

MAX_GROUP_BYTES = 128


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The limits one group obeys (each None: none)."""

    concurrency: int | None = None
    max_jobs: int | None = None
    per_ms: int | None = None


def check_group(value: Any) -> str:
    """A group name: a non-empty str of at most ``MAX_GROUP_BYTES`` UTF-8 bytes."""
    if not isinstance(value, str):
        raise ConfigError(f"group must be a str, got {type(value).__name__} {value!r}")
    size = len(utf8_text(value, "group"))
    if not 0 < size <= MAX_GROUP_BYTES:
        raise ConfigError(f"group must be 1 to {MAX_GROUP_BYTES} bytes of UTF-8, got {size} bytes")
    return value


def add_grouped_call(keys: QueueKeys, jobs: list[tuple[str, bytes]]) -> Call:
    """``add_grouped.lua`` for ``(group, member)`` pairs (member: ``codec.encode_member``)."""
    argv: list[Any] = [keys.prefix, len(jobs)]
    for group, member in jobs:
        argv += (group, member)
    return script_call("add_grouped", (keys.controls, keys.groups), argv)


def take_grouped_call(keys: QueueKeys, n: int, max_stream_len: int, lease_ms: int) -> Call:
    """``take_grouped.lua``: up to ``n`` jobs of the waiting groups to the stream, round robin."""
    return script_call(
        "take_grouped", (keys.groups, keys.stream, keys.group_limits), (n, max_stream_len, lease_ms, keys.prefix)
    )


def requeue_grouped_calls(keys: QueueKeys, group: str, member: bytes, block_ms: int) -> list[Call]:
    """A grouped job back at the head of its group's list, and the group blocked for
    ``block_ms`` (``RateLimited``): the stream entry is settled by the caller."""
    return [
        command("LPUSH", keys.group_jobs(group), member),
        command("ZADD", keys.groups, "NX", 0, group),
        *block_calls(keys, block_ms, keys.group_blocked(group)),
    ]


def _count(what: str, value: Any, most: int) -> int | None:
    return None if value is None else check_count(what, value, most)


def _fields(group: str | None) -> tuple[str, str]:
    if group is None:
        return "dc", "dr"
    check_group(group)
    return "c:" + group, "r:" + group


def set_group_limits(
    keys: QueueKeys,
    concurrency: int | None = None,
    max_jobs: int | None = None,
    per_ms: int | None = None,
    group: str | None = None,
) -> Flow[None]:
    """Set the limits of ``group`` (None: the default of every group without its own).  A
    limit given as None is removed; ``max_jobs`` and ``per_ms`` go together."""
    conc = _count("concurrency", concurrency, MAX_CONCURRENCY)
    rmax, rper = _count("max_jobs", max_jobs, MAX_RATE_JOBS), _count("per_ms", per_ms, MAX_RATE_PER_MS)
    if (rmax is None) != (rper is None):
        raise ConfigError("max_jobs and per_ms go together: give both, or neither")
    c_field, r_field = _fields(group)
    calls = []
    calls.append(
        command("HSET", keys.group_limits, c_field, conc) if conc else command("HDEL", keys.group_limits, c_field)
    )
    if rmax is not None:
        calls.append(command("HSET", keys.group_limits, r_field, f"{rmax}:{rper}"))
    else:
        calls.append(command("HDEL", keys.group_limits, r_field))
    yield calls


def get_group_limits(keys: QueueKeys, group: str | None = None) -> Flow[GroupLimits]:
    """The limits ``group`` obeys (its own, else the default), as the workers read them."""
    if group is not None:
        check_group(group)
    kind = yield command("TYPE", keys.group_limits)
    if kind not in (b"hash", "hash"):
        return GroupLimits()
    fields = ["dc", "dr"] if group is None else ["c:" + group, "dc", "r:" + group, "dr"]
    raw = yield command("HMGET", keys.group_limits, *fields)
    conc_raw, rate_raw = (raw[0], raw[1]) if group is None else (raw[0] or raw[1], raw[2] or raw[3])
    concurrency = positive_int(conc_raw)
    max_jobs = per_ms = None
    if rate_raw is not None:
        text = rate_raw.decode("utf-8", "replace") if isinstance(rate_raw, bytes) else str(rate_raw)
        head, sep, tail = text.partition(":")
        m, p = positive_int(head), positive_int(tail)
        if sep and m is not None and p is not None:
            max_jobs, per_ms = m, p
    return GroupLimits(concurrency, max_jobs, per_ms)


def clear_group_limits(keys: QueueKeys, group: str | None = None) -> Flow[None]:
    """Remove the limits of ``group`` (None: the default)."""
    c_field, r_field = _fields(group)
    yield command("HDEL", keys.group_limits, c_field, r_field)
