"""The queue rate limit (issue 24): ``Queue.set_rate_limit(max_jobs, per_ms)``.

Real servers (Redis 7.0 and Valkey 8.1) and worker *processes* that record each handler start
with its wall-clock time; the windows are fixed and aligned on the server's clock, which is
this host's clock too.  ``take_starts.lua`` is also driven directly, with hostile values in the
controls and in its state.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from pathlib import Path

import pytest
import redis
from engine_support import running, wait_until_sync
from fault_support import WorkerGroup, read_records

from airflow_provider_chasqui import ConfigError, RateLimit, SyncQueue, Worker
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.core.controls import parse_controls, parse_take, take_starts_call
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine.flow_gate import GRANT_LOGGED
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
@pytest.mark.parametrize(("max_jobs", "per_ms"), [(40, 1000), (8, 200)])
def test_three_workers_together_keep_the_limit(
    matrix_url, queue_name: str, tmp_path: Path, max_jobs: int, per_ms: int
) -> None:
    """No aligned window of ``per_ms`` starts more than ``max_jobs`` jobs over three worker
    processes, and the achieved rate is within 10% of the limit; every job runs once.

    A job starts when the limit grants it (the script, on the server's clock); its handler
    runs a few milliseconds later, so a grant at the very end of a window shows its handler
    start in the next one.  The windows are therefore counted from the grants the workers log
    with the server's time, and every handler start must come from one of them; the handler
    starts bound two windows' grants and give the achieved rate."""
    url = matrix_url.url
    n = 8 * max_jobs * 1000 // per_ms  # about eight seconds of work at the limit
    with SyncQueue(queue_name, redis_url=url) as q:
        q.set_rate_limit(max_jobs, per_ms)
        assert q.get_rate_limit() == RateLimit(max_jobs, per_ms)
        q.add_bulk([{"name": "r", "data": {"i": i}} for i in range(n)])
        group = WorkerGroup.spawn(url, queue_name, tmp_path, "rate", concurrency=20, grant_log=1)
        try:
            wait_until_sync(lambda: group.ended() >= n, 120, what="every job at the limit")
        finally:
            group.stop()
    rec = read_records(group.records)
    assert sorted(rec.counts) == list(range(n)) and max(rec.counts.values()) == 1
    granted = collections.Counter()
    for count, server_ms in group.grants():
        granted[server_ms // per_ms] += count
    assert sum(granted.values()) == n  # every start was granted once
    assert max(granted.values()) <= max_jobs, sorted(granted.items())[:20]
    starts = sorted(float(r[3]) for r in group.start_rows())
    per_window = collections.Counter(math.floor(t * 1000 / per_ms) for t in starts)
    assert max(per_window.values()) <= 2 * max_jobs, sorted(per_window.items())[:20]
    # the rate over the whole windows between the first and the last
    first, last = min(per_window), max(per_window)
    inner = [per_window.get(w, 0) for w in range(first + 1, last)]
    assert inner, per_window
    achieved = sum(inner) / len(inner)
    assert achieved >= 0.9 * max_jobs, (achieved, inner)


def take(driver: SyncDriver, keys: QueueKeys, want: int) -> tuple[int, int, bool]:
    """``take_starts`` for ``want`` made-up entry ids."""
    return parse_take(driver.call(take_starts_call(keys, [b"%d-0" % i for i in range(want)], 30_000)), want)[:3]


def test_take_starts_grants_a_window_at_most(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(redis_url)
    try:
        assert take(driver, keys, 5) == (5, 0, False)  # no limit
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            q.set_rate_limit(10, 60_000)
            granted = [take(driver, keys, 4) for _ in range(4)]
            assert [g for g, _, _ in granted] == [4, 4, 2, 0]
            assert all(0 < w <= 60_000 for g, w, _ in granted if g < 4)
            assert not any(slotted for _, _, slotted in granted)  # a rate limit alone takes no slot
            assert 0 < driver.call(command("PTTL", keys.rate)) <= 61_000  # one window + 1 s: bounded
            q.clear_rate_limit()
            assert q.get_rate_limit() is None
            assert take(driver, keys, 7) == (7, 0, False)
    finally:
        driver.close()


@pytest.mark.single_node("writes the controls with a plain client")
@pytest.mark.parametrize(
    ("fields", "limited"),
    [
        ({"rate_max": b"10", "rate_per_ms": b"60000"}, True),
        ({"rate_max": b"0", "rate_per_ms": b"60000"}, False),
        ({"rate_max": b"-5", "rate_per_ms": b"60000"}, False),
        ({"rate_max": b"inf", "rate_per_ms": b"60000"}, False),
        ({"rate_max": b"nan", "rate_per_ms": b"1000"}, False),
        ({"rate_max": b"1e3", "rate_per_ms": b"1000"}, False),
        ({"rate_max": b"10", "rate_per_ms": b"0"}, False),
        ({"rate_max": b"10", "rate_per_ms": b"\xff\x00"}, False),
        ({"rate_max": b"10"}, False),
        ({"rate_max": b"9" * 13, "rate_per_ms": b"1000"}, False),
    ],
)
def test_hostile_limits_are_no_limit_in_lua_and_python(
    redis_url: str, queue_name: str, fields: dict, limited: bool
) -> None:
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        r.hset(keys.controls, mapping=fields)
        r.set(keys.rate, b"\xff not a hash")  # hostile state: replaced, never an error
    driver = SyncDriver(redis_url)
    try:
        got = [take(driver, keys, 6)[0] for _ in range(3)]
        assert got == ([6, 4, 0] if limited else [6, 6, 6])
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            assert (q.get_rate_limit() is not None) is limited
        assert (parse_controls(driver.call(command("HGETALL", keys.controls))).rate is not None) is limited
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("max_jobs", "per_ms"),
    [
        (0, 1000),
        (-1, 1000),
        (10, 0),
        (True, 1000),
        (10.0, 1000),
        ("10", 1000),
        (10, float("inf")),
        (10**10, 1000),
        (10, 10**12),
    ],
)
def test_bad_limits_are_config_errors(redis_url: str, queue_name: str, max_jobs, per_ms) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q, pytest.raises(ConfigError, match="max_jobs|per_ms"):
        q.set_rate_limit(max_jobs, per_ms)


async def test_a_limit_set_while_workers_run_is_obeyed(
    redis_url: str, queue_name: str, queues, worker_factory, caplog: pytest.LogCaptureFixture
) -> None:
    """An in-process worker drains fast until the limit is set; from then on (within the
    controls' 100 ms), every start is granted by the limit, at most the limit per window.

    As in the worker-process test above, the windows are counted from the grants the worker
    logs with the server's time: a grant at the very end of a window shows its handler start
    in the next one, so the handler starts bound two windows' grants."""
    q = queues(queue_name, redis_url)
    started: list[float] = []

    async def handler(job):
        started.append(time.time())

    caplog.set_level(logging.DEBUG, logger="airflow_provider_chasqui.engine.flow_gate")
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=10)):
        await q.add_bulk([{"name": "a", "data": i} for i in range(50)])
        await asyncio.wait_for(_until(lambda: len(started) >= 50), 60)
        await q.set_rate_limit(5, 500)
        await asyncio.sleep(0.3)  # past the workers' controls cache (100 ms): the bound under test
        added_at = time.time()
        await q.add_bulk([{"name": "b", "data": i} for i in range(30)])
        await asyncio.wait_for(_until(lambda: len(started) >= 80), 60)
    granted: collections.Counter[int] = collections.Counter()
    for m in GRANT_LOGGED.finditer(caplog.text):
        granted[int(m.group(2)) // 500] += int(m.group(1))
    assert sum(granted.values()) == 30  # every start after the limit was set was granted by it
    assert max(granted.values()) <= 5, sorted(granted.items())
    windows = collections.Counter(math.floor(t * 1000 / 500) for t in started[50:])
    assert max(windows.values()) <= 2 * 5, windows
    assert started[-1] - added_at >= 2.0  # 30 jobs at 10/s: three seconds, give or take a window


async def test_chasquimq_worker_rate_limit_options_set_the_queues_limit(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """chasquimq's ``Worker(rate_limit_max=, rate_limit_duration_ms=)``: the queue's limit,
    shared by every worker, set when the worker starts; 60 jobs at 10 per aligned second span
    six windows (more than four seconds from the first start), and no second holds more than
    two windows' worth."""
    q = queues(queue_name, redis_url)
    started: list[float] = []

    async def handler(job):
        started.append(time.monotonic())

    await q.add_bulk([{"name": "rl", "data": i} for i in range(60)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=8, rate_limit_max=10, rate_limit_duration_ms=1000)
    async with running(w):
        await asyncio.wait_for(_until(lambda: len(started) >= 60), 60)
    assert await q.get_rate_limit() == RateLimit(10, 1000)
    assert started[-1] - started[0] >= 3.9, started[-1] - started[0]
    assert max(len([t for t in started if s <= t < s + 1.0]) for s in started) <= 20


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rate_limit_max": 10, "rate_limit_group_key": "tenant"}, "group_key is not supported"),
        ({"rate_limit_duration_ms": 1000}, "needs rate_limit_max"),
        ({"rate_limit_max": 0, "rate_limit_duration_ms": 1000}, "rate_limit_max must be a positive int"),
        ({"rate_limit_max": 5, "rate_limit_duration_ms": -1}, "rate_limit_duration_ms must be a positive int"),
        ({"rate_limit_max": 2.5}, "rate_limit_max must be a positive int"),
        ({"rate_limit_max": True}, "rate_limit_max must be a positive int"),
    ],
)
def test_chasquimq_worker_rate_limit_options_are_checked(queue_name: str, options, words) -> None:
    async def handler(job):
        return None

    with pytest.raises(ConfigError, match=words):
        Worker(queue_name, handler, **options)


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


# ---- RateLimited (an HTTP 429 from a handler) ---------------------------------------------------
@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_rate_limited_stops_every_worker_and_counts_no_attempt(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Three worker processes drain a backlog; one job's handler raises ``RateLimited(2000)``.
    From 0.5 s after (the other workers learn within their 100 ms controls cache, and finish
    what was already running) until the 2 s are over, no job starts anywhere; the limited job
    runs again after them, still at attempt 0, and every job completes exactly once."""
    url, ms, n = matrix_url.url, 2000, 900
    marker = tmp_path / "raised"
    with SyncQueue(queue_name, redis_url=url) as q:
        q.add_bulk([{"name": "r", "data": {"i": i, **({"rate_limited_ms": ms} if i == 150 else {})}} for i in range(n)])
        group = WorkerGroup.spawn(
            url, queue_name, tmp_path, "limited", concurrency=5, handler_sleep_ms=10, marker=marker
        )
        try:
            wait_until_sync(lambda: group.ended() >= n, 120, what="every job")
        finally:
            group.stop()
    raised = float(marker.read_text())
    rec = read_records(group.records)
    assert sorted(rec.counts) == list(range(n)) and max(rec.counts.values()) == 1
    rows = group.start_rows()
    quiet = [r for r in rows if raised + 0.5 < float(r[3]) < raised + ms / 1000 - 0.05]
    assert quiet == [], f"{len(quiet)} jobs started while the queue was rate limited"
    limited = sorted((float(r[3]), int(r[4])) for r in rows if r[0] == "150")
    assert len(limited) == 2 and [a for _t, a in limited] == [0, 0], limited  # no attempt counted
    assert limited[1][0] >= raised + ms / 1000 - 0.05
    assert sum(1 for r in rows if float(r[3]) > raised + ms / 1000) > 100  # and the queue went on


def test_rate_limited_values_are_checked() -> None:
    from airflow_provider_chasqui import RateLimited

    assert RateLimited(1.2).retry_after_ms == 2 and RateLimited().retry_after_ms == 1000
    for bad in (float("nan"), float("inf"), -1, True, "5", 10**12):
        with pytest.raises(ConfigError, match="retry_after_ms"):
            RateLimited(bad)


async def test_a_handler_raising_rate_limited_in_process(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """One worker: the limited job and every job behind it wait out the block; no failure is
    recorded (no failed event, no retry), and the job's result is stored once it ran."""
    from airflow_provider_chasqui import RateLimited

    q = queues(queue_name, redis_url)
    seen: dict[int, int] = collections.Counter()
    starts: list[float] = []

    async def handler(job):
        starts.append(time.time())
        seen[job.data] += 1
        if job.data == 3 and seen[3] == 1:
            raise RateLimited(1000)
        return job.data

    async with running(worker_factory(queue_name, handler, redis_url, concurrency=2, store_results=True)):
        jobs = await q.add_bulk([{"name": "x", "data": i} for i in range(10)])
        assert await asyncio.gather(*(j.wait_for_result(timeout=60) for j in jobs)) == list(range(10))
    assert seen[3] == 2 and max(seen.values()) == 2 and sum(seen.values()) == 11
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) >= 0.95, gaps  # the block: one second without a start
    assert await q.get_job_state(jobs[3].id) == "completed"
