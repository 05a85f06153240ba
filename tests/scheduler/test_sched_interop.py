"""Interop with the real chasquimq 1.3.0 package (its Rust producer runs these Lua paths on
Redis 7): it reads the specs we write and we read, fire and manage the ones it writes; the
stored bytes are identical for identical specs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from sched_support import FakeClock, fires

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern, SyncQueue
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler

pytestmark = pytest.mark.interop


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[SyncQueue]:
    with SyncQueue(queue_name, redis_url=redis_url) as queue:
        yield queue


async def test_identical_specs_are_byte_identical(
    chasquimq, redis_url: str, queue_name: str, q: SyncQueue, r: redis.Redis
) -> None:
    theirs = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        cases = [
            (
                "report",
                {"to": "ada@example.com"},
                dict(repeat=chasquimq.RepeatPattern.every(60_000)),
                dict(repeat=RepeatPattern.every(60_000)),
            ),
            (
                "nightly",
                {"to": "ada@example.com"},
                dict(
                    repeat=chasquimq.RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
                    limit=10,
                    end_before_ms=1_893_456_000_000,
                    missed_fires=chasquimq.MissedFiresPolicy.fire_all(100),
                ),
                dict(
                    repeat=RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
                    limit=10,
                    end_before_ms=1_893_456_000_000,
                    missed_fires=MissedFiresPolicy.fire_all(100),
                ),
            ),
            (
                "every-min",
                [1, 2.5, None, b"\x00"],
                dict(
                    repeat=chasquimq.RepeatPattern.cron("* * * * *"),
                    start_after_ms=1_900_000_000_000,
                    missed_fires=chasquimq.MissedFiresPolicy.fire_once(),
                ),
                dict(
                    repeat=RepeatPattern.cron("* * * * *"),
                    start_after_ms=1_900_000_000_000,
                    missed_fires=MissedFiresPolicy.fire_once(),
                ),
            ),
        ]
        for name, data, their_kw, our_kw in cases:
            job = await theirs.upsert_repeatable_job(name, data, **their_kw)
            their_bytes = r.hget(q.keys.repeat_spec(job.id), "spec")
            their_score = r.zscore(q.keys.repeat, job.id)
            ours = q.upsert_repeatable_job(name, data, **our_kw)
            assert ours.id == job.id
            assert r.hget(q.keys.repeat_spec(job.id), "spec") == their_bytes, name
            # the same next fire (chasquimq's cron keeps the millisecond part of "now")
            assert abs(r.zscore(q.keys.repeat, job.id) - their_score) < 1_000, name
    finally:
        await theirs.close()


async def test_chasquimq_lists_and_removes_our_specs(
    chasquimq, redis_url: str, queue_name: str, q: SyncQueue, r: redis.Redis
) -> None:
    ours = q.upsert_repeatable_job(
        "mine",
        {"x": 1},
        repeat=RepeatPattern.cron("*/5 * * * *", tz="Europe/Madrid"),
        attempts=3,
        deadline=60_000,
        limit=4,
        missed_fires=MissedFiresPolicy.fire_once(),
    )
    paused = q.upsert_repeatable_job("hidden", 2, repeat=RepeatPattern.every(1000))
    q.pause_repeatable(paused.id)
    theirs = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        (meta,) = await theirs.get_repeatable_jobs()  # the paused one is invisible to it
        assert meta.key == ours.id and meta.job_name == "mine" and meta.limit == 4
        assert meta.pattern == chasquimq.RepeatPattern.cron("*/5 * * * *", tz="Europe/Madrid")
        assert meta.missed_fires == chasquimq.MissedFiresPolicy.fire_once()
        assert meta.next_fire_ms == q.get_repeatable_job(ours.id).next_fire_ms
        assert await theirs.remove_repeatable_by_key(ours.id) is True
    finally:
        await theirs.close()
    assert q.get_repeatable_job(ours.id) is None and not r.exists(q.keys.repeat_spec(ours.id))


async def test_we_read_fire_and_manage_chasquimq_specs(
    chasquimq, redis_url: str, queue_name: str, q: SyncQueue, r: redis.Redis
) -> None:
    theirs = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        job = await theirs.upsert_repeatable_job(
            "theirs",
            {"n": 7},
            repeat=chasquimq.RepeatPattern.every(1000),
            limit=2,
            missed_fires=chasquimq.MissedFiresPolicy.fire_all(5),
        )
        cron = await theirs.add("cronjob", [1], repeat=chasquimq.RepeatPattern.cron("0 9 * * 1", tz="Asia/Tokyo"))
    finally:
        await theirs.close()
    info = q.get_repeatable_job(job.id)
    assert info is not None and info.data == {"n": 7} and info.limit == 2
    assert info.missed_fires == MissedFiresPolicy.fire_all(5) and info.attempts is None
    assert {m.key for m in q.get_repeatable_jobs()} == {job.id, cron.id}
    items, _ = q.list_repeatable()
    assert {i.key for i in items} == {job.id, cron.id}
    first = int(r.zscore(q.keys.repeat, job.id))  # chasquimq keeps the millisecond part of now
    driver = AsyncDriver(redis_url)
    try:
        clock = FakeClock(first + 2_500)
        s = Scheduler(driver, q.name, now_fn=clock)
        assert await s._acquire()
        await s.tick()
    finally:
        await driver.close()
    got = fires(r, q.name)
    assert [(f.name, f.scheduled_ms) for f in got] == [("theirs", first), ("theirs", first + 1000)]
    assert all(f.envelope.inner == b"\x81\xa1n\x07" for f in got)
    assert q.get_repeatable_job(job.id) is None  # limit 2 reached: removed, as ChasquiMQ does
    assert q.pause_repeatable(cron.id) and q.get_repeatable_job(cron.id).paused
    assert q.resume_repeatable(cron.id) and q.remove_repeatable_by_key(cron.id)
