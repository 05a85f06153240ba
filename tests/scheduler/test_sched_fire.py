"""The scheduler end to end on real Redis: fires driven by a fake clock (DST matrix, missed-fire
policies, limits, deadlines, quarantine, compare-and-set races) and by the real one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import msgpack
import pytest
import redis
from engine_support import running, wait_until
from sched_support import FakeClock, fire_times, fires

from airflow_provider_chasqui import (
    BackoffSpec,
    ConfigError,
    MissedFiresPolicy,
    Queue,
    RepeatPattern,
    SyncQueue,
    Worker,
)
from airflow_provider_chasqui.core.calls import Stream
from airflow_provider_chasqui.core.codec import BackoffWire, RetryOverride, ulid_ms
from airflow_provider_chasqui.core.repeat import StoredSpec
from airflow_provider_chasqui.core.scheduler import SchedulerCore, fire_job_id
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler
from airflow_provider_chasqui.sync._driver import SyncDriver

SECOND = 1000


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


def make(driver: AsyncDriver, queue: str, clock: FakeClock, **kw: Any) -> Scheduler:
    return Scheduler(driver, queue, now_fn=clock, **kw)


async def tick(s: Scheduler) -> Any:
    assert await s._acquire()
    await s.tick()
    return s.last


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


# ---- DST matrix ------------------------------------------------------------------------------


def expected_daily(zone: str, hour: int, minute: int, day: date) -> int:
    """The instant a daily ``minute hour * * *`` cron fires on local ``day``, worked out
    independently: a nonexistent time fires at the end of the gap, an ambiguous one once,
    at its earlier instant."""
    tz = ZoneInfo(zone) if "/" in zone or zone == "UTC" else timezone(timedelta(hours=5, minutes=30))
    wall = datetime(day.year, day.month, day.day, hour, minute)
    t0 = wall.replace(tzinfo=tz, fold=0).timestamp()
    t1 = wall.replace(tzinfo=tz, fold=1).timestamp()
    if t0 <= t1:  # normal, or an overlap: the earlier instant
        return int(t0) * 1000
    t = int(t1)  # a gap: walk to the first second whose offset differs
    before = datetime.fromtimestamp(t, tz).utcoffset()
    while datetime.fromtimestamp(t, tz).utcoffset() == before:
        t += 60
    while datetime.fromtimestamp(t - 1, tz).utcoffset() != before:
        t -= 1
    return t * 1000


DST_CASES = [
    ("America/New_York", 2, 30, date(2027, 3, 14), "gap"),
    ("America/New_York", 1, 30, date(2027, 11, 7), "overlap"),
    ("Europe/Madrid", 2, 30, date(2027, 3, 28), "gap"),
    ("Europe/Madrid", 2, 30, date(2027, 10, 31), "overlap"),
    ("Australia/Lord_Howe", 2, 15, date(2027, 10, 3), "gap"),  # 30-minute shift: 02:00 -> 02:30
    ("Australia/Lord_Howe", 1, 45, date(2027, 4, 4), "overlap"),  # 02:00 -> 01:30
    ("+05:30", 2, 30, date(2027, 3, 14), "fixed"),
    ("UTC", 2, 30, date(2027, 3, 14), "fixed"),
]


@pytest.mark.parametrize(
    ("zone", "hour", "minute", "day", "kind"), DST_CASES, ids=[f"{c[0]}-{c[4]}" for c in DST_CASES]
)
async def test_dst_matrix_fires_once_per_local_day(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, zone: str, hour: int, minute: int, day: date, kind: str
) -> None:
    start = ms(datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(days=3))
    key = q.upsert_repeatable_job(
        "dst", {"zone": zone}, repeat=RepeatPattern.cron(f"{minute} {hour} * * *", tz=zone), start_after_ms=start
    ).id
    clock = FakeClock(start)
    s = make(driver, q.name, clock)
    for _ in range(7 * 24 * 4):  # a week of 15-minute ticks
        clock.advance(15 * 60 * SECOND)
        await tick(s)
    got = fire_times(r, q.name)
    days = [day + timedelta(days=d) for d in range(-4, 6)]
    want = [expected_daily(zone, hour, minute, d) for d in days]
    want = [w for w in want if start < w <= clock.ms]
    assert got == want
    assert len(set(got)) == len(got)
    if kind == "gap":  # the nonexistent wall time fired once, at the end of the gap
        on_day = [t for t in got if datetime.fromtimestamp(t / 1000, ZoneInfo(zone)).date() == day]
        assert len(on_day) == 1
        local = datetime.fromtimestamp(on_day[0] / 1000, ZoneInfo(zone))
        assert (local.hour, local.minute) > (hour, minute) or local.hour > hour
    assert [f.name for f in fires(r, q.name)] == ["dst"] * len(got)
    assert q.get_repeatable_job(key).fired == len(got)


async def test_six_field_cron_with_seconds(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    base = (time.time_ns() // 1_000_000 // 60_000 + 1) * 60_000
    q.upsert_repeatable_job("sec", 1, repeat=RepeatPattern.cron("*/15 * * * * *"), start_after_ms=base - 1)
    clock = FakeClock(base)
    s = make(driver, q.name, clock)
    for _ in range(12):
        await tick(s)
        clock.advance(5 * SECOND)
    assert fire_times(r, q.name) == [base, base + 15_000, base + 30_000, base + 45_000]


# ---- missed fires, limits, deadlines ----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expect_fires", "expect_next_offset"),
    [
        (None, [], 11_000),
        (MissedFiresPolicy.fire_once(), [0], 11_000),
        (MissedFiresPolicy.fire_all(0), [], 11_000),  # chasquimq allows it: as skip
        (MissedFiresPolicy.fire_all(3), [0, 1000, 2000], 11_000),
        (MissedFiresPolicy.fire_all(100), list(range(0, 10_001, 1000)), 11_000),
    ],
)
async def test_missed_fire_policies_after_downtime(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, policy: Any, expect_fires: list[int], expect_next_offset: int
) -> None:
    key = q.upsert_repeatable_job("m", 1, repeat=RepeatPattern.every(SECOND), missed_fires=policy).id
    first = int(r.zscore(q.keys.repeat, key))
    clock = FakeClock(first + 10_500)  # the scheduler was down for ten windows
    s = make(driver, q.name, clock)
    await tick(s)
    assert fire_times(r, q.name) == [first + x for x in expect_fires]
    assert r.zscore(q.keys.repeat, key) == first + expect_next_offset  # from the timeline, not from now
    clock.advance(600)
    await tick(s)
    assert fire_times(r, q.name)[len(expect_fires) :] == [first + 11_000]  # back on the fast path


async def test_cron_fire_all_replays_missed_minutes(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    key = q.upsert_repeatable_job(
        "c", 1, repeat=RepeatPattern.cron("* * * * *"), missed_fires=MissedFiresPolicy.fire_all(100)
    ).id
    first = int(r.zscore(q.keys.repeat, key))
    clock = FakeClock(first + 5 * 60_000 + 30_000)
    await tick(make(driver, q.name, clock))
    assert fire_times(r, q.name) == [first + i * 60_000 for i in range(6)]
    assert r.zscore(q.keys.repeat, key) == first + 6 * 60_000


async def test_next_fire_comes_from_the_scheduled_time_not_from_now(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    key = q.upsert_repeatable_job("lag", 1, repeat=RepeatPattern.every(10 * SECOND)).id
    first = int(r.zscore(q.keys.repeat, key))
    clock = FakeClock(first + 7_300)  # 7.3 s late: the chain must not lag behind
    await tick(make(driver, q.name, clock))
    assert fire_times(r, q.name) == [first]
    assert r.zscore(q.keys.repeat, key) == first + 10_000


async def test_limit_and_end_before_end_a_spec(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    lim = q.upsert_repeatable_job("lim", 1, repeat=RepeatPattern.every(SECOND), limit=3).id
    first = int(r.zscore(q.keys.repeat, lim))
    end = q.upsert_repeatable_job(
        "end", 1, repeat=RepeatPattern.every(SECOND), end_before_ms=first + 2_500, key="end"
    ).id
    clock = FakeClock(first)
    s = make(driver, q.name, clock)
    for _ in range(8):
        await tick(s)
        clock.advance(SECOND)
    by_name: dict[str, list[int]] = {}
    for f in fires(r, q.name):
        by_name.setdefault(f.name, []).append(f.scheduled_ms)
    assert by_name["lim"] == [first, first + 1000, first + 2000]
    end_first = min(by_name["end"])
    assert all(t <= first + 2_500 for t in by_name["end"]) and len(by_name["end"]) == len(set(by_name["end"]))
    assert end_first >= first - 10
    assert q.get_repeatable_job(lim) is None and q.get_repeatable_job(end) is None


async def test_deadline_skips_late_fires_and_counts_them(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    key = q.upsert_repeatable_job(
        "dl", 1, repeat=RepeatPattern.every(SECOND), deadline=500, missed_fires=MissedFiresPolicy.fire_all(10)
    ).id
    first = int(r.zscore(q.keys.repeat, key))
    s = make(driver, q.name, FakeClock(first + 3_300))
    result = await tick(s)
    assert (result.fired, result.skipped) == (1, 3)
    assert fire_times(r, q.name) == [first + 3_000]
    info = q.get_repeatable_job(key)
    assert (info.fired, info.skipped) == (1, 3)
    assert s.skipped_total == 3


@pytest.mark.parametrize("policy", [MissedFiresPolicy.skip(), MissedFiresPolicy.fire_all(10)])
async def test_while_paused_skip_drops_the_fires_due_while_the_queue_is_paused(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, policy: Any
) -> None:
    """Issue 24: while the queue is paused, a ``while_paused="skip"`` spec's fires are skipped
    and counted (its timeline goes on), a default ("queue") spec's fires are queued to run
    after the resume; after the resume both fire again."""
    skip = q.upsert_repeatable_job(
        "skip", 1, repeat=RepeatPattern.every(SECOND), while_paused="skip", missed_fires=policy
    ).id
    keep = q.upsert_repeatable_job("keep", 1, repeat=RepeatPattern.every(SECOND), missed_fires=policy).id
    assert q.get_repeatable_job(skip).while_paused == "skip" and q.get_repeatable_job(keep).while_paused == "queue"
    first = max(int(r.zscore(q.keys.repeat, skip)), int(r.zscore(q.keys.repeat, keep)))
    clock = FakeClock(first)
    s = make(driver, q.name, clock)
    await tick(s)
    q.pause()
    for _ in range(3):
        clock.advance(SECOND)
        await tick(s)
    by_name: dict[str, list[int]] = {}
    for f in fires(r, q.name):
        by_name.setdefault(f.name, []).append(f.scheduled_ms)
    assert len(by_name["skip"]) == 1 and len(by_name["keep"]) == 4  # the fire before the pause, then none
    assert q.get_repeatable_job(skip).skipped == 3
    assert int(r.zscore(q.keys.repeat, skip)) > first + 3_000 - SECOND  # the timeline went on
    q.resume()
    clock.advance(SECOND)
    await tick(s)
    after = [f.name for f in fires(r, q.name)]
    assert after.count("skip") == 2 and after.count("keep") == 5


def test_while_paused_is_checked(q: SyncQueue) -> None:
    for bad in ("Skip", "drop", 1, True):
        with pytest.raises(ConfigError, match="while_paused"):
            q.upsert_repeatable_job("x", 1, repeat=RepeatPattern.every(SECOND), while_paused=bad)
    with pytest.raises(ConfigError, match="while_paused"):
        q.upsert_repeatable_bulk([{"name": "x", "repeat": RepeatPattern.every(SECOND), "while_paused": "never"}])


async def test_retry_override_reaches_every_fired_envelope(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    key = q.upsert_repeatable_job(
        "ov",
        {"a": 1},
        repeat=RepeatPattern.every(SECOND),
        attempts=7,
        backoff=BackoffSpec.exponential(250, multiplier=3.0, max_ms=10_000, jitter_ms=50),
    ).id
    plain = q.upsert_repeatable_job("plain", {"a": 2}, repeat=RepeatPattern.every(SECOND)).id
    first = int(r.zscore(q.keys.repeat, key))
    clock = FakeClock(first + 100)
    s = make(driver, q.name, clock)
    await tick(s)
    clock.advance(SECOND)
    await tick(s)
    got = {f.name: f.envelope for f in fires(r, q.name)}
    want = RetryOverride(7, BackoffWire("exponential", 250, 10_000, 3.0, 50))
    assert got["ov"].retry == want and got["plain"].retry is None
    assert got["ov"].inner == msgpack.packb({"a": 1}) and got["ov"].attempt == 0
    assert got["ov"].created_at_ms == clock.ms or got["ov"].created_at_ms == clock.ms - SECOND
    ov_ids = [f.envelope.id for f in fires(r, q.name) if f.name == "ov"]
    assert ov_ids == [fire_job_id(key, first), fire_job_id(key, first + 1000)]
    assert plain


async def test_worker_applies_the_specs_attempts(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """The spec says attempts=2; the worker's default is 25: the fire is dead-lettered after 2 runs."""
    runs: list[str] = []

    async def handler(job: Any) -> None:
        runs.append(job.id)
        raise ValueError("boom")

    async with Queue(queue_name, redis_url=redis_url) as aq:
        key = (
            await aq.upsert_repeatable_job(
                "fails", 1, repeat=RepeatPattern.every(300), attempts=2, backoff=BackoffSpec.fixed(10), limit=1
            )
        ).id
        worker = Worker(queue_name, handler, redis_url=redis_url, concurrency=2, read_block_ms=200)
        async with running(worker):
            dlq = await wait_until(lambda: aq.peek_dlq(), timeout=20, what="the fire to be dead-lettered")
        assert dlq[0]["name"] == "fails" and dlq[0]["reason"] == "retries_exhausted"
        assert len(runs) == 2 and len(set(runs)) == 1
        assert ulid_ms(runs[0]) is not None and await aq.get_repeatable_job(key) is None


# ---- bad stored data --------------------------------------------------------------------------


async def test_quarantine_moves_undecodable_specs_aside_and_the_loop_goes_on(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, caplog: pytest.LogCaptureFixture
) -> None:
    good = q.upsert_repeatable_job("good", 1, repeat=RepeatPattern.every(SECOND)).id
    first = int(r.zscore(q.keys.repeat, good))
    junk = msgpack.packb(["not", "a", "spec"])
    bad_tz = StoredSpec(
        "badtz", "x", RepeatPattern(kind="cron", expression="* * * * *", tz="Nowhere/Land"), b"\x01"
    ).encode()
    r.zadd(q.keys.repeat, {"junk": first, "badtz": first, "dangling": first})
    r.hset(q.keys.repeat_spec("junk"), "spec", junk)
    r.hset(q.keys.repeat_spec("badtz"), "spec", bad_tz)
    s = make(driver, q.name, FakeClock(first + 10))
    with caplog.at_level(logging.ERROR, logger="airflow_provider_chasqui.engine.scheduler"):
        result = await tick(s)
    assert result.fired == 1 and {k for k, _ in result.quarantined} == {"junk", "badtz"}
    assert result.dropped == ["dangling"]
    assert q.get_quarantined() == {"junk": junk, "badtz": bad_tz}
    assert "junk" in caplog.text and "badtz" in caplog.text and "unknown timezone" in caplog.text
    assert r.zrange(q.keys.repeat, 0, -1) == [good.encode()]
    assert not r.exists(q.keys.repeat_spec("junk"), q.keys.repeat_spec("badtz"))


async def test_a_score_that_is_no_instant_re_anchors_a_valid_spec(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    q.upsert_repeatable_job("a", 1, repeat=RepeatPattern.every(SECOND), key="inf")
    q.upsert_repeatable_job(
        "b", 1, repeat=RepeatPattern.cron("* * * * * *"), key="neg", missed_fires=MissedFiresPolicy.fire_all(2**32 - 1)
    )
    r.zadd(q.keys.repeat, {"inf": float("-inf"), "neg": -(10**15)})
    clock = FakeClock(time.time_ns() // 1_000_000)
    result = await tick(make(driver, q.name, clock))
    assert (result.fired, result.quarantined) == (0, [])
    assert r.zscore(q.keys.repeat, "inf") == clock.ms + SECOND  # the spec goes on from now
    assert clock.ms < r.zscore(q.keys.repeat, "neg") <= clock.ms + SECOND
    assert q.get_quarantined() == {}


async def test_fire_all_catch_up_is_bounded_per_tick(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    key = q.upsert_repeatable_job(
        "c", 1, repeat=RepeatPattern.cron("* * * * * *"), missed_fires=MissedFiresPolicy.fire_all(2**32 - 1)
    ).id
    first = int(r.zscore(q.keys.repeat, key))
    s = make(driver, q.name, FakeClock(first + 3 * 86_400_000))  # three days of seconds missed
    started = time.monotonic()
    result = await tick(s)
    assert time.monotonic() - started < 60
    assert result.fired == 10_000  # the list cap of wire spec 15.4
    assert fire_times(r, q.name)[:2] == [first, first + 1000]


# ---- races --------------------------------------------------------------------------------------


def run_call(driver: SyncDriver, call: Any) -> Any:
    """Execute one step of a core flow (a call, a pipeline or a stream)."""
    if isinstance(call, Stream):
        return driver.stream(call.calls)
    return driver.pipeline(call) if isinstance(call, list) else driver.call(call)


def test_two_leaders_at_once_cannot_fire_a_window_twice(q: SyncQueue, r: redis.Redis, redis_url: str) -> None:
    q.upsert_repeatable_bulk([{"name": f"s{i}", "data": i, "repeat": RepeatPattern.every(SECOND)} for i in range(50)])
    now = int(max(r.zrange(q.keys.repeat, 0, -1, withscores=True), key=lambda p: p[1])[1]) + 10
    d = SyncDriver(redis_url)
    a, b = SchedulerCore(q.name).tick(now), SchedulerCore(q.name).tick(now)
    fetch_a, fetch_b = next(a), next(b)
    sched_a = a.send(run_call(d, fetch_a))
    sched_b = b.send(run_call(d, fetch_b))  # both read the same 50 due specs
    res = []
    for flow, call in ((a, sched_a), (b, sched_b)):
        try:
            flow.send(run_call(d, call))
        except StopIteration as stop:
            res.append(stop.value)
    assert (res[0].fired, res[0].lost) == (50, 0) and (res[1].fired, res[1].lost) == (0, 50)
    times = [(f.name, f.scheduled_ms) for f in fires(r, q.name)]
    assert len(times) == 50 == len(set(times))
    d.close()


def test_an_update_during_a_tick_wins_and_the_old_fire_never_happens(
    q: SyncQueue, r: redis.Redis, redis_url: str
) -> None:
    key = q.upsert_repeatable_job("u", 1, repeat=RepeatPattern.every(SECOND), key="upd").id
    first = int(r.zscore(q.keys.repeat, key))
    d = SyncDriver(redis_url)
    flow = SchedulerCore(q.name).tick(first + 10)
    call = flow.send(run_call(d, next(flow)))  # planned a fire of the old timeline
    q.upsert_repeatable_job("u", 2, repeat=RepeatPattern.every(3_600_000), key="upd")
    new_score = r.zscore(q.keys.repeat, key)
    with pytest.raises(StopIteration) as stop:
        flow.send(run_call(d, call))
    assert stop.value.value.lost == 1 and stop.value.value.fired == 0
    assert r.xlen(q.keys.stream) == 0 and r.zscore(q.keys.repeat, key) == new_score
    d.close()


async def test_a_paused_spec_is_invisible_to_any_scheduler(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    key = q.upsert_repeatable_job("p", 1, repeat=RepeatPattern.every(SECOND)).id
    first = int(r.zscore(q.keys.repeat, key))
    q.pause_repeatable(key)
    # What a ChasquiMQ scheduler reads (wire spec 15.2 step 2) no longer holds the spec.
    assert r.zrangebyscore(q.keys.repeat, "-inf", first + 60_000) == []
    clock = FakeClock(first + 5_000)
    s = make(driver, q.name, clock)
    await tick(s)
    assert r.xlen(q.keys.stream) == 0
    q.resume_repeatable(key)
    clock.set(int(r.zscore(q.keys.repeat, key)) + 5)
    await tick(s)
    assert len(fire_times(r, q.name)) == 1


# ---- real time --------------------------------------------------------------------------------


async def test_every_specs_fire_for_real_on_time(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    class Metrics:
        calls: list[tuple[str, int, int]] = []

        def scheduler_fire(self, queue: str, n: int, lag: int) -> None:
            self.calls.append((queue, n, lag))

    metrics = Metrics()
    async with Queue(queue_name, redis_url=redis_url) as aq:
        for i in range(3):
            await aq.upsert_repeatable_job(
                f"e{i}", i, repeat=RepeatPattern.every(300 + 100 * i), missed_fires=MissedFiresPolicy.fire_all(10)
            )  # a busy CI box may lag
        s = Scheduler(aq.driver, queue_name, metrics=metrics)
        task = asyncio.create_task(s.run())
        try:
            await asyncio.sleep(3.2)
        finally:
            s.stop()
            await task
    per: dict[str, list[Any]] = {}
    for f in fires(r, queue_name):
        per.setdefault(f.name, []).append(f)
    for i in range(3):
        got = per[f"e{i}"]
        interval = 300 + 100 * i
        assert len(got) >= 3000 // interval - 2
        gaps = {b.scheduled_ms - a.scheduled_ms for a, b in zip(got, got[1:])}
        assert gaps == {interval}, (f"e{i}", gaps)  # no duplicates, no missed windows
        lags = sorted(f.entry_ms - f.scheduled_ms for f in got)
        # it sleeps until the next due fire, not a whole tick (bounds generous for loaded CI machines)
        assert lags[len(lags) // 2] < 300 and lags[-1] < 1500, lags
    assert metrics.calls and all(c[0] == queue_name for c in metrics.calls)
    assert r.get(f"{{chasqui:{queue_name}}}:scheduler:lock") is None  # released on stop
