"""A fire-all backlog at the wire spec's cap (10,000 windows) beside many ordinary specs, on
Redis 7.0: the tick plans it a piece per chunk (at most ``FIRE_BUDGET`` windows), yields the
event loop between the pieces, and still fires every window exactly once, in order, then
re-arms the spec on its timeline after now."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from sched_support import FakeClock, fires

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.repeat import (
    FIRE_ALL_LIST_CAP,
    catchup_fires,
    catchup_next,
    plan_fires,
)
from airflow_provider_chasqui.core.scheduler import FIRE_BUDGET
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler

SECOND = 1000
NORMAL = 2000  # ordinary specs due once each


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[SyncQueue]:
    with SyncQueue(queue_name, redis_url=redis_url) as queue:
        yield queue


@pytest.fixture
async def driver(redis_url: str) -> AsyncIterator[AsyncDriver]:
    d = AsyncDriver(redis_url)
    yield d
    await d.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "pattern",
    [
        RepeatPattern.every(7 * SECOND),
        RepeatPattern.cron("*/7 * * * * *"),
        RepeatPattern.cron("0 9 * * 1-5", tz="Europe/Madrid"),
    ],
    ids=str,
)
@pytest.mark.parametrize("piece", [1, 3, 250, 1000])
def test_pieces_of_a_catch_up_add_up_to_the_whole_plan(pattern: RepeatPattern, piece: int) -> None:
    """Planning a backlog piece by piece (each from the cursor the last returned) gives the
    windows and the next score of ``plan_fires``, with and without the cap and start_after."""
    at = 1_700_000_000_000
    for start_after, cap, span in ((None, 10_000, 3000), (at + 50_000, 40, 3000), (None, 2**32 - 1, 12_000)):
        now = at + span * SECOND * (1 if pattern.kind == "every" or "*/7" in str(pattern.expression) else 40)
        whole, nxt = plan_fires(pattern, at, now, start_after, MissedFiresPolicy.fire_all(cap))
        got: list[int] = []
        cursor: int | None = at
        left = min(cap, FIRE_ALL_LIST_CAP)
        while cursor is not None and cursor <= now and left > 0:
            fires, cursor = catchup_fires(pattern, cursor, now, start_after, min(piece, left))
            got += fires
            left -= len(fires)
        assert got == whole and catchup_next(pattern, cursor, now, start_after) == nxt


@pytest.mark.timeout(300)
async def test_a_capped_fire_all_backlog_is_planned_in_pieces_and_fires_each_window_once(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    # a per-second cron whose score is 3 hours stale: 10,800 windows, replayed up to the cap
    backlog = q.upsert_repeatable_job(
        "backlog",
        0,
        repeat=RepeatPattern.cron("* * * * * *"),
        key="backlog",
        missed_fires=MissedFiresPolicy.fire_all(2**32 - 1),
    ).id
    q.upsert_repeatable_bulk(
        [
            {"name": f"n{i}", "data": i, "repeat": RepeatPattern.every(60 * SECOND + i), "key": f"n{i}"}
            for i in range(NORMAL)
        ]
    )
    now = (time.time_ns() // 1_000_000 // SECOND + 4 * 3600) * SECOND + 321  # off the second boundary
    stale = now - 321 - 3 * 3600 * SECOND
    r.zadd(q.keys.repeat, {backlog: stale})
    r.zadd(q.keys.repeat, {f"n{i}": now - 500 for i in range(NORMAL)})
    s = Scheduler(driver, q.name, now_fn=FakeClock(now), batch=NORMAL + 1)
    assert await s._acquire()

    cpu_gaps: list[float] = []
    wall_gaps: list[float] = []
    done = asyncio.Event()

    async def cpu_probe() -> None:  # CPU time of this thread between two turns of the loop: the
        last = time.thread_time()  # tick's own work, not the time a loaded box keeps us waiting
        while not done.is_set():
            await asyncio.sleep(0)
            t = time.thread_time()
            cpu_gaps.append(t - last)
            last = t

    async def wall_probe() -> None:  # what a co-hosted task sees: lateness of a 5 ms timer
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            t = time.perf_counter()
            wall_gaps.append(t - last - 0.005)
            last = t

    # a cyclic GC pass over a long pytest session's heap takes 100s of ms wherever it lands: that
    # is the test process's, not the tick's, so it runs before the probes start measuring
    gc.collect()
    gc.disable()
    probes = [asyncio.create_task(cpu_probe()), asyncio.create_task(wall_probe())]
    await asyncio.sleep(0)
    try:
        await s.tick()
    finally:
        gc.enable()
        done.set()
        await asyncio.gather(*probes)
    result = s.last
    assert result is not None and result.due == NORMAL + 1 and result.lost == 0 and not result.quarantined
    assert result.fired == NORMAL + FIRE_ALL_LIST_CAP
    # deterministic: the backlog in pieces of FIRE_BUDGET windows (each its own chunk, sent once
    # the piece before it is fenced), then the ordinary specs a chunk of 250 at a time
    assert result.chunks == FIRE_ALL_LIST_CAP // FIRE_BUDGET + -(-NORMAL // s.core.chunk)
    assert len(cpu_gaps) >= result.chunks  # the loop turned between the chunks
    print(
        f"\nlongest loop step {max(cpu_gaps) * 1000:.1f} ms of CPU, worst 5 ms-timer lateness "
        f"{max(wall_gaps) * 1000:.1f} ms, {result.chunks} chunks"
    )
    # a piece of 1,000 cron windows measures ~20 ms of CPU (the unchunked tick: ~200 ms); the
    # bound is loose so a loaded 2-core box does not flake, and still far below the old step
    assert max(cpu_gaps) < 0.1, f"the loop was blocked for {max(cpu_gaps) * 1000:.0f} ms of CPU"

    got = fires(r, q.name)
    assert Counter(f.envelope.id for f in got).most_common(1)[0][1] == 1  # no fire id twice
    replayed = [f.scheduled_ms for f in got if f.name == "backlog"]
    assert replayed == [stale + w * SECOND for w in range(FIRE_ALL_LIST_CAP)]  # each window once, in order
    assert sorted(f.name for f in got if f.name != "backlog") == sorted(f"n{i}" for i in range(NORMAL))
    # past the cap the spec resumes at its first instant after now, on the cron boundary
    assert r.zscore(q.keys.repeat, backlog) == now - 321 + SECOND
    assert int(r.hget(q.keys.repeat_spec(backlog), "fired")) == FIRE_ALL_LIST_CAP

    await s.tick()  # nothing left over: the next tick at the same instant fires nothing
    assert s.last is not None and s.last.fired == 0 and len(fires(r, q.name)) == len(got)


@pytest.mark.timeout(120)
async def test_a_backlog_cut_short_by_its_limit_counts_no_lost_fences(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    """``limit`` ends the spec inside the first piece: the later pieces find it gone, which is
    no lost fence; the ordinary spec after it still fires."""
    capped = q.upsert_repeatable_job(
        "capped",
        0,
        repeat=RepeatPattern.every(SECOND),
        key="capped",
        limit=1500,
        missed_fires=MissedFiresPolicy.fire_all(5000),
    ).id
    other = q.upsert_repeatable_job("other", 0, repeat=RepeatPattern.every(SECOND), key="other").id
    first = int(r.zscore(q.keys.repeat, capped))
    now = first + 4000 * SECOND + 10
    r.zadd(q.keys.repeat, {capped: first, other: now - 5})
    s = Scheduler(driver, q.name, now_fn=FakeClock(now))
    assert await s._acquire()
    await s.tick()
    result = s.last
    assert result is not None and (result.fired, result.lost) == (1501, 0)
    got = fires(r, q.name)
    assert [f.scheduled_ms for f in got if f.name == "capped"] == [first + w * SECOND for w in range(1500)]
    assert r.zscore(q.keys.repeat, capped) is None and r.zscore(q.keys.repeat, other) == now - 5 + SECOND
