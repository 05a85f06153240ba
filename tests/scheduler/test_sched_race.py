"""High availability with real processes: several schedulers on one queue never fire a window
twice nor skip one, and when the leader is killed another takes over within TTL + one tick."""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest
import redis
from sched_support import Fire, fires, spawn_scheduler, stop_proc, wait_ready

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern, SyncQueue

SPECS = 200


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def upsert_specs(q: SyncQueue, n: int) -> list[int]:
    """``n`` every-1 s specs whose phases spread over one second; returns their first fires."""
    t0 = now_ms()
    q.upsert_repeatable_bulk(
        [
            {
                "name": "race",
                "data": i,
                "key": f"s{i:03}",
                "repeat": RepeatPattern.every(1000),
                "start_after_ms": t0 + i * (1000 // n),
                "missed_fires": MissedFiresPolicy.fire_all(100),
            }
            for i in range(n)
        ]
    )
    with redis.Redis.from_url(q._url) as r:
        return [int(r.zscore(q.keys.repeat, f"s{i:03}")) for i in range(n)]


def check_timelines(got: list[Fire], firsts: list[int], n: int, until: int) -> dict[str, list[int]]:
    """Every spec fired each of its windows up to ``until`` exactly once."""
    ids = [f.envelope.id for f in got]
    assert len(ids) == len(set(ids)), "a fire id (spec key + scheduled time) appeared twice"
    per: dict[str, list[int]] = defaultdict(list)
    for f in got:
        per[f.envelope.inner.hex()].append(f.scheduled_ms)
    assert len(per) == n
    for i in range(n):
        inner = bytes([i]) if i < 128 else b"\xcc" + bytes([i])
        times = sorted(per[inner.hex()])
        assert times[0] == firsts[i], (i, times[:3])
        assert [b - a for a, b in zip(times, times[1:])] == [1000] * (len(times) - 1), (i, "gap or duplicate")
        assert times[-1] >= until - 1000, (i, "windows missing at the end", times[-1], until)
    return per


def test_several_scheduler_processes_fire_each_window_exactly_once(
    redis_url: str, queue_name: str, r: redis.Redis
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        firsts = upsert_specs(q, SPECS)
    procs = [spawn_scheduler(redis_url, queue_name) for _ in range(2)]
    # two more that ignore the leader lock: concurrent leaders, only the compare-and-set between them
    procs += [spawn_scheduler(redis_url, queue_name, "--always-lead", "--tick-ms", "200") for _ in range(2)]
    try:
        for p in procs:
            wait_ready(p)
        # let them race for ten windows of every spec (a condition, not a clock: a loaded box is slower)
        stream, deadline = f"{{chasqui:{queue_name}}}:stream", time.monotonic() + 60
        while r.xlen(stream) < SPECS * 10:
            assert time.monotonic() < deadline, f"only {r.xlen(stream)} fires in 60 s"
            time.sleep(0.05)
        # stop the scheduling, then everything fired up to the last window due before it
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            for i in range(SPECS):
                q.pause_repeatable(f"s{i:03}")
        until = now_ms() - 200
    finally:
        results = [stop_proc(p) for p in procs]
    assert [code for code, _ in results] == [0, 0, 0, 0]
    got = fires(r, queue_name)
    assert len(got) >= SPECS * 9
    assert sum(st["fired"] for _, st in results) == len(got)
    assert sum(st["lost"] for _, st in results) > 0  # the leaders really did collide
    check_timelines(got, firsts, SPECS, until - 1500)
    lags = sorted(f.entry_ms - f.scheduled_ms for f in got)
    assert lags[len(lags) // 2] < 1000, lags[len(lags) // 2]


def test_killed_leader_is_replaced_within_lock_ttl_plus_one_tick(
    redis_url: str, queue_name: str, r: redis.Redis
) -> None:
    n = 20
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        firsts = upsert_specs(q, n)
    procs = [spawn_scheduler(redis_url, queue_name) for _ in range(3)]
    try:
        holders = {wait_ready(p): p for p in procs}
        deadline = time.monotonic() + 10
        while r.xlen(f"{{chasqui:{queue_name}}}:stream") < n * 2:
            assert time.monotonic() < deadline, "no fires"
            time.sleep(0.05)
        leader = r.get(f"{{chasqui:{queue_name}}}:scheduler:lock").decode()
        killed_at = now_ms()
        holders[leader].send_signal(signal.SIGKILL)
        holders[leader].wait(10)
        # wait for another holder, then for every spec to fire twice more under it
        lock, stream = f"{{chasqui:{queue_name}}}:scheduler:lock", f"{{chasqui:{queue_name}}}:stream"
        deadline = time.monotonic() + 30
        while (new_leader := r.get(lock)) is None or new_leader.decode() == leader:
            assert time.monotonic() < deadline, "nobody took the lock over"
            time.sleep(0.05)
        target = r.xlen(stream) + 2 * n
        while r.xlen(stream) < target:
            assert time.monotonic() < deadline, "no fires after the takeover"
            time.sleep(0.05)
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            for i in range(n):
                q.pause_repeatable(f"s{i:03}")
        until = now_ms() - 200
    finally:
        for p in procs:
            stop_proc(p)
    got = fires(r, queue_name)
    after = [f.entry_ms for f in got if f.entry_ms > killed_at + 50]
    resumed_in = min(after) - killed_at
    print(f"firing resumed {resumed_in} ms after the leader was killed")
    assert resumed_in <= 5000 + 1000 + 1000, resumed_in  # lock TTL + one tick (+ slack for a loaded machine)
    # fire-all policy: the windows that fell due during the takeover were replayed, none twice
    check_timelines(got, firsts, n, until - 1500)
