"""Deduplication inside repeatable specs (issue 25; BullMQ breaks there, bullmq#2954).

A spec upserted with ``dedup_id`` / ``dedup_mode`` / ``dedup_ttl_ms`` adds every fire as
``add(dedup_id=...)`` adds a job, in the firing script itself (``lua/schedule_batch.lua`` op
'U'), so a fire and any other producer of the same id share one marker: throttle keeps one job
per window, debounce keeps one job waiting.  Real servers (Redis 7.0, Valkey 8.1, Redis 8.2);
the race runs a real scheduler loop against four producer threads.
"""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
import redis
from sched_support import fires
from test_sched_hostile import run_tick

from airflow_provider_chasqui import ConfigError, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.codec import decode_data, decode_envelope
from airflow_provider_chasqui.core.repeat import StoredSpec
from airflow_provider_chasqui.core.scheduler import fire_job_id
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.parametrize("compat_mode", [False], ids=["auto"], indirect=True),
]
SECOND = 1000


def _events(r: redis.Redis, q: SyncQueue, kind: str) -> list[dict[str, str]]:
    out = []
    for _id, fields in r.xrange(q.keys.events):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        if f.get("e") == kind:
            out.append(f)
    return out


def test_a_throttled_spec_adds_one_job_per_window_shared_with_other_producers(
    q: SyncQueue, r: redis.Redis, queue_name: str
) -> None:
    every = RepeatPattern.every(SECOND)
    q.upsert_repeatable_job("poll", 1, repeat=every, key="P", dedup_id="feed", dedup_ttl_ms=60_000)
    info = q.get_repeatable_job("P")
    assert info is not None and (info.dedup_id, info.dedup_mode, info.dedup_ttl_ms) == ("feed", "throttle", 60_000)
    s = int(r.zscore(q.keys.repeat, "P"))
    first = run_tick(q.driver, queue_name, s + 10)
    second = run_tick(q.driver, queue_name, s + SECOND + 10)  # the marker lives: skipped and counted
    assert (first.fired, second.fired, second.skipped) == (1, 0, 1)
    first_id = fire_job_id("P", s)
    assert [f.envelope.id for f in fires(r, queue_name)] == [first_id]
    assert q.get_repeatable_job("P").skipped == 1
    (event,) = _events(r, q, "deduplicated")
    assert (event["id"], event["dedup_id"], event["mode"]) == (first_id, "feed", "throttle")
    # another producer of the id meets the spec's marker, and the other way round
    assert q.add("poll", 2, dedup_id="feed", dedup_ttl_ms=60_000).id == first_id
    r.delete(q.keys.dedup("feed"))  # the window ends
    manual = q.add("poll", 3, dedup_id="feed", dedup_ttl_ms=60_000).id
    third = run_tick(q.driver, queue_name, s + 2 * SECOND + 10)
    assert (third.fired, third.skipped) == (0, 1)
    assert [f.envelope.id for f in fires(r, queue_name)] == [first_id, manual]
    r.delete(q.keys.dedup("feed"))
    assert run_tick(q.driver, queue_name, s + 3 * SECOND + 10).fired == 1
    assert [f.envelope.id for f in fires(r, queue_name)][-1] == fire_job_id("P", s + 3 * SECOND)


def test_a_debounced_spec_keeps_one_fire_waiting(q: SyncQueue, r: redis.Redis, queue_name: str) -> None:
    """Each fire waits ``dedup_ttl_ms`` in the delayed set and replaces the one still waiting;
    a manual debounced add of the same id replaces the spec's fire too."""
    q.upsert_repeatable_job(
        "flush",
        {"n": 1},
        repeat=RepeatPattern.every(SECOND),
        key="D",
        dedup_id="buf",
        dedup_mode="debounce",
        dedup_ttl_ms=5_000,
    )
    s = int(r.zscore(q.keys.repeat, "D"))
    for i in range(3):
        assert run_tick(q.driver, queue_name, s + i * SECOND + 10).fired == 1
    ((member, score),) = r.zrange(q.keys.delayed, 0, -1, withscores=True)
    n = int.from_bytes(member[:4], "little")
    assert decode_envelope(member[4 + n :]).id == fire_job_id("D", s + 2 * SECOND)
    assert score == s + 2 * SECOND + 10 + 5_000  # pushed back from the last fire's tick
    replaced = _events(r, q, "deduplicated")
    assert [(e["id"], e["replaced_by"]) for e in replaced] == [
        (fire_job_id("D", s), fire_job_id("D", s + SECOND)),
        (fire_job_id("D", s + SECOND), fire_job_id("D", s + 2 * SECOND)),
    ]
    assert r.xlen(q.keys.stream) == 0
    manual = q.add("flush", {"n": 9}, dedup_id="buf", dedup_mode="debounce", dedup_ttl_ms=5_000).id
    ((member, _score),) = r.zrange(q.keys.delayed, 0, -1, withscores=True)
    assert decode_envelope(member[4 + int.from_bytes(member[:4], "little") :]).id == manual


async def test_a_throttled_spec_racing_four_producers_keeps_one_job_per_window(
    q: SyncQueue, r: redis.Redis, url: str, queue_name: str
) -> None:
    """A real scheduler loop fires the spec every 100 ms while four threads add with the same
    id as fast as they can for 2 s, then alone for 2.5 s: consecutive jobs in the stream are
    never closer than the window (the marker's TTL, on the server's clock), across the race
    and the hand-over."""
    ttl = 700
    q.upsert_repeatable_job("poll", "spec", repeat=RepeatPattern.every(100), key="R", dedup_id="race", dedup_ttl_ms=ttl)
    stop = threading.Event()

    def producer(i: int) -> None:
        with SyncQueue(queue_name, redis_url=url) as mine:
            while not stop.is_set():
                mine.add("poll", i, dedup_id="race", dedup_ttl_ms=ttl)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    driver = AsyncDriver(url)
    scheduler = Scheduler(driver, queue_name, tick_ms=20)
    task = asyncio.create_task(scheduler.run())
    for t in threads:
        t.start()
    try:
        await asyncio.sleep(2)  # the producers race the spec (they win most windows) ...
        stop.set()
        for t in threads:
            await asyncio.to_thread(t.join, 30)
        await asyncio.sleep(2.5)  # ... then the spec goes on alone (it wins every window)
    finally:
        stop.set()
        scheduler.stop()
        await asyncio.wait_for(task, 30)
        await driver.close()
    entries = r.xrange(q.keys.stream)
    stamps = [int(eid.split(b"-")[0]) for eid, _f in entries]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) >= 4, stamps
    assert min(gaps) >= ttl - 2, gaps  # one job per window, whoever added it
    sources = [decode_data(decode_envelope(f[b"d"]).inner) for _eid, f in entries]
    info = q.get_repeatable_job("R")
    assert info is not None and info.fired == sources.count("spec") > 0, (info, sources)
    assert len(sources) > sources.count("spec") and info.skipped > 0  # each side met the other's marker


def test_hostile_dedup_fields_quarantine_only_their_spec(q: SyncQueue, r: redis.Redis, queue_name: str) -> None:
    q.upsert_repeatable_job("good", 1, repeat=RepeatPattern.every(SECOND), key="good", dedup_id="g", dedup_ttl_ms=1000)
    at = int(r.zscore(q.keys.repeat, "good"))
    pad = [1, None, None, 0, None, None, None]
    hostile = {
        "not-list": [*pad, "x"],
        "short": [*pad, ["id", "throttle"]],
        "empty-id": [*pad, ["", "throttle", 1000]],
        "bad-mode": [*pad, ["id", "sometimes", 1000]],
        "zero-ttl": [*pad, ["id", "throttle", 0]],
        "float-ttl": [*pad, ["id", "throttle", 1.5]],
        "nan-ttl": [*pad, ["id", "throttle", float("nan")]],
        "huge-ttl": [*pad, ["id", "throttle", 2**62]],
        "with-priority": [1, None, None, 0, None, 3, None, ["id", "throttle", 1000]],
    }
    for key, ext in hostile.items():
        spec = StoredSpec(key, "evil", RepeatPattern.every(SECOND), msgpack.packb(1)).encode()
        r.zadd(q.keys.repeat, {key: at})
        r.hset(q.keys.repeat_spec(key), mapping={"spec": spec, "ext": msgpack.packb(ext)})
    r.set(q.keys.dedup("g"), "a string, not the marker hash")  # replaced, as add_dedup.lua does
    result = run_tick(q.driver, queue_name, at + 10)
    reasons = dict(result.quarantined)
    assert set(reasons) == set(hostile), reasons
    assert all("dedup" in why for why in reasons.values()), reasons
    assert result.fired == 1 and r.xlen(q.keys.stream) == 1
    assert r.hget(q.keys.dedup("g"), "job") == fire_job_id("good", at).encode()


def test_bad_dedup_options_on_specs_are_config_errors(q: SyncQueue) -> None:
    every = RepeatPattern.every(SECOND)
    for options, message in [
        ({"dedup_id": "d", "dedup_ttl_ms": 0}, "dedup_ttl_ms must be more than 0"),
        ({"dedup_id": "d", "dedup_ttl_ms": float("inf")}, "dedup_ttl_ms must be more than 0"),
        ({"dedup_id": "d", "dedup_mode": "sometimes", "dedup_ttl_ms": 10}, "unknown dedup_mode"),
        ({"dedup_id": "", "dedup_ttl_ms": 10}, "dedup_id must be a non-empty str"),
        ({"dedup_ttl_ms": 10}, "need dedup_id"),
        ({"dedup_id": "d", "dedup_ttl_ms": 10, "priority": 1}, "cannot be combined with priority"),
    ]:
        with pytest.raises(ConfigError, match=message):
            q.upsert_repeatable_job("x", 1, repeat=every, **options)
        with pytest.raises(ConfigError, match=message):
            q.add("x", 1, repeat=every, **options)
    assert q.list_repeatable()[0] == []
