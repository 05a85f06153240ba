"""The per-minute history (``core/history.py``, issue 28): workers write it with their beat, the
dashboard charts it, it outlives the worker and the dashboard, and a queue's keys stay within the
bytes ``docs/dashboard.md`` documents, however busy the queue and whatever is in its fields."""

from __future__ import annotations

import math

import pytest
import redis

from airflow_provider_chasqui.core.history import (
    HOUR_MS,
    MAX_HOURS_READ,
    MINUTE_MS,
    RETAIN_MS,
    MinuteCounts,
    parse_hours,
    read_calls,
)
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.dashboard.data import Source
from airflow_provider_chasqui.errors import ConfigError

pytestmark = pytest.mark.timeout(180)

# docs/dashboard.md: what one queue's history may hold, measured on Redis 7.0, Valkey 8/9 and
# Redis 8.2 (listpack hashes of at most 120 fields)
MAX_BYTES_PER_HOUR = 2_048
MAX_BYTES_PER_QUEUE = MAX_BYTES_PER_HOUR * (MAX_HOURS_READ)


def test_counts_land_in_their_minute_and_bucket() -> None:
    keys = QueueKeys.for_queue("h")
    counts = MinuteCounts()
    now = 1_800_000_000_000 // HOUR_MS * HOUR_MS + 59 * MINUTE_MS + 30_000  # hh:59:30
    counts.add(now, 3, 1)
    counts.add(now + 10_000, 2)
    counts.add(now + 40_000, 5)  # the next hour's minute 0
    counts.add(now, 0, 0)
    counts.add(now, -4, -1)  # never subtracts
    calls = counts.take_calls(keys)
    assert not counts and counts.take_calls(keys) == []
    hour = now // HOUR_MS
    args = [c.args for c in calls]
    assert ("HINCRBY", keys.history(hour), "c59", 5) in args
    assert ("HINCRBY", keys.history(hour), "f59", 1) in args
    assert ("HINCRBY", keys.history(hour + 1), "c0", 5) in args
    assert ("PEXPIREAT", keys.history(hour), (hour + 1) * HOUR_MS + RETAIN_MS) in args
    replies = [[b"c59", b"5", b"f59", b"1"], {b"c0": b"5", b"bogus": b"9", b"c61": b"1", b"f3": b"x", b"c": b"2"}]
    s = parse_hours([hour, hour + 1], replies, now + 40_000, 2 * HOUR_MS, HOUR_MS)
    assert s.completed == [5, 5] and s.failed == [1, 0] and s.step_ms == HOUR_MS
    minute = parse_hours([hour, hour + 1], replies, now + 40_000, 2 * MINUTE_MS, MINUTE_MS)
    assert minute.completed == [5, 5] and minute.failed == [1, 0]


def test_a_read_never_asks_for_more_hours_than_a_queue_holds() -> None:
    hours, calls = read_calls(QueueKeys.for_queue("h"), 10**13, 10**12)
    assert len(hours) == len(calls) == MAX_HOURS_READ
    for bad in (math.inf, math.nan, 3.5, -1, 0, True, "60000", None):  # refused by name, never looped on
        with pytest.raises(ConfigError, match="history span must be a positive whole number"):
            read_calls(QueueKeys.for_queue("h"), 10**13, bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="history step must be a positive whole number"):
            parse_hours([], [], 10**13, HOUR_MS, bad)  # type: ignore[arg-type]


@pytest.mark.single_node("MEMORY USAGE per key: the same on every node")
def test_a_full_week_stays_within_the_documented_bytes(redis_url: str, queue_name: str) -> None:
    """Every minute of 8 days busy with completions and failures of 10 digits: 193 keys at most,
    each expiring, all within MAX_BYTES_PER_QUEUE; the chart reads it back whole."""
    keys = QueueKeys.for_queue(queue_name)
    r = redis.Redis.from_url(redis_url)
    now = r.time()[0] * 1000
    counts = MinuteCounts()
    for minute in range((now - RETAIN_MS - HOUR_MS) // MINUTE_MS, now // MINUTE_MS + 1):
        counts.add(minute * MINUTE_MS, 2**62, 2**61)  # the widest integers a listpack stores
    pipe = r.pipeline(transaction=False)
    for call in counts.take_calls(keys):
        pipe.execute_command(*call.args)
    pipe.execute()
    names = list(r.scan_iter(match=f"{keys.prefix}:history:*", count=1000))
    assert 0 < len(names) <= MAX_HOURS_READ + 1  # +1: the hour that expires this very hour
    sizes = [r.memory_usage(k) or 0 for k in names]
    assert max(sizes) <= MAX_BYTES_PER_HOUR, max(sizes)
    assert sum(sizes) <= MAX_BYTES_PER_QUEUE, sum(sizes)
    assert all(r.object("encoding", k) in (b"listpack", b"ziplist") for k in names)
    assert all(0 < r.pttl(k) <= RETAIN_MS + HOUR_MS for k in names)
    print(f"history of a queue busy every minute: {len(names)} keys, {sum(sizes)} bytes, max {max(sizes)}/key")
    src = Source("t", redis_url)
    try:
        week = src.history(queue_name, 7 * 24 * HOUR_MS, HOUR_MS)
        assert len(week.completed) == 168 and all(c == 60 * 2**62 for c in week.completed[:-1])
        assert week.failed[0] == 60 * 2**61
    finally:
        src.close()
        r.delete(*names)
