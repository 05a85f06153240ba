"""Hostile bytes in every part of the repeat keyspace (members, key types, hash fields, counters,
scores) against running schedulers on Redis 7.0, Valkey 8.1 and Redis 8.2: each bad entry is
quarantined with its reason, every other spec keeps firing once per window, no fire id twice.
Also: the scheduler's clock is Redis', a stale score costs O(1) cron evaluations, and a tick
yields the event loop between its chunks."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import redis
from sched_support import FakeClock, fires

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core import cron as cron_mod
from airflow_provider_chasqui.core.repeat import StoredSpec
from airflow_provider_chasqui.core.scheduler import SchedulerCore, fire_job_id
from airflow_provider_chasqui.engine import scheduler as engine_scheduler
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler
from airflow_provider_chasqui.errors import ScriptError
from airflow_provider_chasqui.sync._driver import SyncDriver

SECOND = 1000
WINDOWS = 5


# the scheduler uses no server fast path: one mode of the matrix (queue_name cleans its server)
pytestmark = pytest.mark.parametrize("compat_mode", [False], ids=["auto"], indirect=True)


@pytest.fixture
async def driver(url: str) -> AsyncIterator[AsyncDriver]:
    d = AsyncDriver(url)
    yield d
    await d.close()


def spec_hash(q: SyncQueue, key: bytes) -> bytes:
    return q.keys.repeat_spec("").encode() + key


def valid_spec(key: str) -> bytes:
    return StoredSpec(key, "evil", RepeatPattern.every(SECOND), msgpack.packb(1)).encode()


def plant_hostile(q: SyncQueue, r: redis.Redis, at: int) -> dict[bytes, str]:
    """Bad entries due at ``at``; returns member -> a word its quarantine reason must contain."""
    bad: dict[bytes, str] = {}

    def member(key: bytes, why: str, **fields: Any) -> None:
        r.zadd(q.keys.repeat, {key: at})
        if fields:
            r.hset(spec_hash(q, key), mapping=fields)
        bad[key] = why

    member(b"\xff\xfe\x00not-utf8", "utf-8", spec=valid_spec("x"))  # a member that is not UTF-8
    for kind in ("string", "list", "set", "zset", "stream"):  # the spec key of the wrong type
        key = f"type-{kind}".encode()
        r.zadd(q.keys.repeat, {key: at})
        h = spec_hash(q, key)
        {
            "string": lambda h=h: r.set(h, "x"),
            "list": lambda h=h: r.rpush(h, "x"),
            "set": lambda h=h: r.sadd(h, "x"),
            "zset": lambda h=h: r.zadd(h, {"x": 1}),
            "stream": lambda h=h: r.xadd(h, {"x": "y"}),
        }[kind]()
        bad[key] = kind
    member(b"fired-text", "fired", spec=valid_spec("fired-text"), fired="abc")
    member(b"fired-float", "fired", spec=valid_spec("fired-float"), fired="1.5")
    member(b"fired-overflow", "fired", spec=valid_spec("fired-overflow"), fired=str(2**63 - 1))
    # (a bad `skipped` counter matters once a fire is skipped: test_a_counter_corrupted_between_read_and_fire_is_fenced)
    member(b"spec-junk", "msgpack", spec=b"\xc1\xff\x00")
    member(b"ext-junk", "ext", spec=valid_spec("ext-junk"), ext=b"\x93\x07\xc0\xc0")
    member(b"spec-\x00\n\r", "deadline", spec=valid_spec("nul"), ext=msgpack.packb([1, None, -5]))
    return bad


async def tick(s: Scheduler) -> Any:
    assert await s._acquire()
    await s.tick()
    return s.last


@pytest.mark.timeout(180)
async def test_hostile_entries_are_quarantined_and_every_other_spec_fires_once_per_window(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    good = [q.upsert_repeatable_job(f"g{i}", i, repeat=RepeatPattern.every(SECOND), key=f"g{i}").id for i in range(6)]
    first = int(min(r.zscore(q.keys.repeat, k) for k in good))
    for k in good:  # one timeline for all, so every window holds each spec once
        r.zadd(q.keys.repeat, {k: first})
    r.hset(spec_hash(q, b"g0"), b"\xff\x00field", b"\xfe")  # a stray hash field is harmless
    bad = plant_hostile(q, r, first)
    clock = FakeClock(first + 10)
    s = Scheduler(driver, q.name, now_fn=clock)
    quarantined: dict[str, str] = {}
    for _ in range(WINDOWS):
        result = await tick(s)
        quarantined.update(result.quarantined)
        clock.advance(SECOND)
    assert s.ticks == WINDOWS
    got = fires(r, q.name)
    ids = Counter(f.envelope.id for f in got)
    assert max(ids.values()) == 1  # no fire id twice
    per = Counter(f.name for f in got)
    assert per == {f"g{i}": WINDOWS for i in range(6)}
    for k in good:
        assert sorted(f.scheduled_ms for f in got if f.name == k) == [first + w * SECOND for w in range(WINDOWS)]
        assert q.get_repeatable_job(k).fired == WINDOWS
    shown = {k.decode("utf-8", "backslashreplace"): why for k, why in bad.items()}
    assert set(quarantined) == set(shown)
    for key, word in shown.items():
        assert word in quarantined[key].lower(), (key, quarantined[key])
    assert set(r.zrange(q.keys.repeat, 0, -1)) == {k.encode() for k in good}
    moved = r.hgetall(q.keys.repeat_quarantine)
    assert set(moved) == set(bad)
    assert moved[b"spec-junk"] == b"\xc1\xff\x00" and moved[b"fired-text"] == valid_spec("fired-text")
    assert not any(r.exists(spec_hash(q, k)) for k in bad)


@pytest.mark.timeout(120)
async def test_a_bad_counter_never_makes_its_chunk_fire_again(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    """Issue #12 item 2: a non-integer ``fired`` in one spec used to make schedule_batch fail
    after its XADDs, before the rescoring ZADD: every tick fired the chunk's other specs again."""
    keys = [
        q.upsert_repeatable_job(f"c{i}", i, repeat=RepeatPattern.every(60 * SECOND), key=f"c{i}").id for i in range(4)
    ]
    first = int(r.zscore(q.keys.repeat, keys[0]))
    for k in keys:
        r.zadd(q.keys.repeat, {k: first})
    r.hset(spec_hash(q, b"c2"), "fired", "not a number")
    s = Scheduler(driver, q.name, now_fn=FakeClock(first + 10))
    for _ in range(5):
        await tick(s)
    ids = Counter(f.envelope.id for f in fires(r, q.name))
    assert ids == {fire_job_id(k, first): 1 for k in ("c0", "c1", "c3")}
    assert {k: r.zscore(q.keys.repeat, k) for k in ("c0", "c1", "c3")} == dict.fromkeys(
        ("c0", "c1", "c3"), first + 60 * SECOND
    )
    assert r.zscore(q.keys.repeat, "c2") is None and b"c2" in r.hgetall(q.keys.repeat_quarantine)


def run_tick(d: SyncDriver, queue: str, now: int, after_fetch: Any = None) -> Any:
    """One ``SchedulerCore`` tick driven by hand; ``after_fetch()`` runs between the read and the fire."""
    from airflow_provider_chasqui.core.calls import Stream

    flow = SchedulerCore(queue).tick(now)
    step = next(flow)
    fetched = False
    try:
        while True:
            reply = d.stream(step.calls) if isinstance(step, Stream) else d.call(step)
            if not fetched and after_fetch is not None:
                after_fetch()
            fetched = True
            step = flow.send(reply)
    except StopIteration as stop:
        return stop.value


@pytest.mark.parametrize("corrupt", ["fired", "skipped", "type"])
def test_a_counter_corrupted_between_read_and_fire_is_fenced(
    q: SyncQueue, r: redis.Redis, url: str, corrupt: str
) -> None:
    """The counter or the key type changes after ``fetch_due`` read the spec: the script itself
    must keep every fire's fence (its rescore) and quarantine that spec alone."""
    once = MissedFiresPolicy.fire_once()
    q.upsert_repeatable_job("a", 1, repeat=RepeatPattern.every(SECOND), key="a", missed_fires=once)
    q.upsert_repeatable_job(
        "b", 1, repeat=RepeatPattern.every(SECOND), key="b", deadline=SECOND, missed_fires=MissedFiresPolicy.fire_all(5)
    )
    q.upsert_repeatable_job("c", 1, repeat=RepeatPattern.every(SECOND), key="c", missed_fires=once)
    first = int(r.zscore(q.keys.repeat, "a"))
    r.zadd(q.keys.repeat, {"a": first, "b": first, "c": first})
    now = first + 2 * SECOND + 500  # b: three windows, the first two past the deadline (skipped)

    def spoil() -> None:
        if corrupt == "type":
            r.delete(spec_hash(q, b"b"))
            r.set(spec_hash(q, b"b"), "x")
        else:
            r.hset(spec_hash(q, b"b"), corrupt, "x")

    d = SyncDriver(url)
    try:
        result = run_tick(d, q.name, now, spoil)
        assert [k for k, _w in result.quarantined] == ["b"] and "corrupt" in result.quarantined[0][1]
        for _ in range(3):  # the same instant again: nothing is due any more
            assert run_tick(d, q.name, now).due == 0
    finally:
        d.close()
    ids = Counter(f.envelope.id for f in fires(r, q.name))
    assert max(ids.values()) == 1
    assert {fire_job_id("a", first), fire_job_id("c", first)} <= set(ids)
    assert r.zscore(q.keys.repeat, "a") == r.zscore(q.keys.repeat, "c") == first + 3 * SECOND
    assert r.zscore(q.keys.repeat, "b") is None and b"b" in r.hgetall(q.keys.repeat_quarantine)


async def test_hostile_scores_are_isolated(q: SyncQueue, r: redis.Redis, driver: AsyncDriver) -> None:
    q.upsert_repeatable_job("ok", 1, repeat=RepeatPattern.every(SECOND), key="ok")
    first = int(r.zscore(q.keys.repeat, "ok"))
    for key, score in (
        ("neg-inf", float("-inf")),
        ("pos-inf", float("inf")),
        ("negative", -1.5),
        ("tiny", 5e-324),
        ("huge", 1.7e308),
        ("frac", first + 0.5),
    ):
        q.upsert_repeatable_job(key, 1, repeat=RepeatPattern.cron("* * * * * *"), key=key)
        r.zadd(q.keys.repeat, {key: score})
    clock = FakeClock(first + 10)
    s = Scheduler(driver, q.name, now_fn=clock)
    for _ in range(3):
        result = await tick(s)
        assert result.quarantined == []
        clock.advance(SECOND)
    assert [f.name for f in fires(r, q.name) if f.name == "ok"] == ["ok"] * 3
    assert r.zscore(q.keys.repeat, "pos-inf") == float("inf") and r.zscore(q.keys.repeat, "huge") == 1.7e308
    for key in ("neg-inf", "negative", "tiny", "frac"):  # re-anchored on a whole second after now
        score = r.zscore(q.keys.repeat, key)
        assert score is not None and score % 1000 == 0 and score > first, (key, score)


# ---- the clock ----------------------------------------------------------------------------------


async def test_the_scheduler_clock_is_redis_time(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader whose local clock runs an hour ahead must not fire anything early: "now" is
    the server's TIME, as the promoter's."""
    key = q.upsert_repeatable_job("t", 1, repeat=RepeatPattern.every(600 * SECOND), key="t").id
    due = int(r.zscore(q.keys.repeat, key))
    ahead = lambda: time.time_ns() // 1_000_000 + 3_600_000  # noqa: E731
    monkeypatch.setattr(engine_scheduler, "now_ms", ahead, raising=False)
    s = Scheduler(driver, q.name)
    result = await tick(s)
    server_ms = int(r.time()[0]) * 1000
    assert result.fired == 0 and r.xlen(q.keys.stream) == 0
    assert abs(result.now_ms - server_ms) < 10_000
    assert r.zscore(q.keys.repeat, key) == due
    assert result.next_due_ms == due


# ---- cost of a stale score ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "max_fires"),
    [
        (None, 0),
        (MissedFiresPolicy.fire_once(), 1),
        (MissedFiresPolicy.fire_all(3), 3),
        (MissedFiresPolicy.fire_all(2**32 - 1), 10_000),
    ],
)
async def test_a_stale_cron_score_costs_o1_evaluations_and_rearms_on_the_boundary(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver, monkeypatch: pytest.MonkeyPatch, policy: Any, max_fires: int
) -> None:
    key = q.upsert_repeatable_job(
        "stale", 1, repeat=RepeatPattern.cron("*/5 * * * *"), key="stale", missed_fires=policy
    ).id
    nxt = int(r.zscore(q.keys.repeat, key))
    stale = nxt - 40 * 86_400_000  # a scheduler outage of 40 days
    r.zadd(q.keys.repeat, {key: stale})
    calls = Counter[str]()
    real = cron_mod.CompiledCron.next_after

    def counted(self: Any, t_ms: int) -> Any:
        calls["n"] += 1
        return real(self, t_ms)

    monkeypatch.setattr(cron_mod.CompiledCron, "next_after", counted)
    now = nxt - 100_000 + 7  # 40 days later, off any boundary
    result = await tick(Scheduler(driver, q.name, now_fn=FakeClock(now)))
    fired = [f.scheduled_ms for f in fires(r, q.name)]
    assert len(fired) == min(max_fires, 40 * 288 + 1) == result.fired
    assert fired == [stale + i * 300_000 for i in range(len(fired))]
    assert calls["n"] <= len(fired) + 3, calls  # O(1) beyond the fires themselves (was ~100,000)
    score = r.zscore(q.keys.repeat, key)
    assert score == nxt and score % 300_000 == 0 and score > now  # the cron boundary after now


# ---- the event loop -----------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_a_big_tick_yields_the_event_loop_between_chunks(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    """3,000 due specs, a third of them stale crons with patterns of their own: the tick plans
    at most a chunk (250 specs) between two yields, and no loop step takes long (the bound is
    generous: a chunk measures ~10-40 ms of CPU on a loaded 2-core box; the stale walk it
    replaced took ~1 s per spec)."""
    n = 3000
    items = []
    for i in range(n):
        rep = RepeatPattern.cron(f"{i % 60} {(i // 60) % 24} * * *") if i % 3 == 0 else RepeatPattern.every(SECOND + i)
        items.append({"name": f"s{i}", "data": i, "repeat": rep, "key": f"s{i}"})
    q.upsert_repeatable_bulk(items)
    now = time.time_ns() // 1_000_000 + 90_000_000
    stale = now - 45 * 86_400_000
    r.zadd(q.keys.repeat, {f"s{i}": stale if i % 3 == 0 else now - 500 for i in range(n)})
    s = Scheduler(driver, q.name, now_fn=FakeClock(now), batch=n)
    assert await s._acquire()
    gaps: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:  # CPU time of this thread between two turns of the probe: the
        last = time.thread_time()  # loop's work, not the time a loaded machine keeps it waiting
        while not done.is_set():
            await asyncio.sleep(0)
            t = time.thread_time()
            gaps.append(t - last)
            last = t

    # a cyclic GC pass over the session's heap is the test process's, not the tick's: it runs
    # before the probe starts measuring
    gc.collect()
    gc.disable()
    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    try:
        await s.tick()
    finally:
        gc.enable()
        done.set()
        await task
    result = s.last
    assert result is not None and result.due == n and result.fired == n - n // 3
    assert result.chunks == -(-n // s.core.chunk)  # planned and sent a chunk at a time
    assert max(gaps) < 0.25, f"the loop was blocked for {max(gaps) * 1000:.0f} ms of CPU"
    assert len(gaps) >= result.chunks  # the tick yielded between chunks


async def test_catch_ups_of_many_windows_are_split_into_chunks(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    """A chunk ends at 250 specs or at 1,000 fires, a catch-up cut into pieces to fit: five
    fire-all specs replaying 600 windows each go in three calls of 1,000 fires, every window
    exactly once."""
    keys = [
        q.upsert_repeatable_job(
            f"fa{i}", i, repeat=RepeatPattern.every(SECOND), key=f"fa{i}", missed_fires=MissedFiresPolicy.fire_all(600)
        ).id
        for i in range(5)
    ]
    first = int(r.zscore(q.keys.repeat, keys[0]))
    r.zadd(q.keys.repeat, dict.fromkeys(keys, first))
    now = first + 10_000 * SECOND + 500
    s = Scheduler(driver, q.name, now_fn=FakeClock(now))
    result = await tick(s)
    assert (result.fired, result.chunks) == (3000, 3)
    got = fires(r, q.name)
    assert Counter(f.envelope.id for f in got).most_common(1)[0][1] == 1
    for k in keys:
        assert sorted(f.scheduled_ms for f in got if f.name == k) == [first + w * SECOND for w in range(600)]
        assert r.zscore(q.keys.repeat, k) == now - 500 + SECOND  # then on the timeline after now


@pytest.mark.timeout(120)
async def test_a_running_scheduler_on_redis_time_isolates_hostile_entries_planted_while_it_runs(
    q: SyncQueue, r: redis.Redis, driver: AsyncDriver
) -> None:
    """The real loop (Redis TIME, real sleeps): hostile entries appear before it starts and
    while it runs; every good spec fires each window once, in order, and the bad ones go."""
    interval = 300
    good = [
        q.upsert_repeatable_job(
            f"r{i}", i, repeat=RepeatPattern.every(interval), key=f"r{i}", missed_fires=MissedFiresPolicy.fire_all(50)
        ).id
        for i in range(4)
    ]

    def now_server() -> int:
        sec, usec = r.time()
        return int(sec) * 1000 + int(usec) // 1000

    bad = plant_hostile(q, r, now_server())
    s = Scheduler(driver, q.name, tick_ms=100)
    task = asyncio.create_task(s.run())
    try:
        await asyncio.sleep(1.2)
        r.hset(spec_hash(q, b"late-\xfe"), "spec", valid_spec("late"))
        r.set(spec_hash(q, b"late-string"), "x")
        r.zadd(q.keys.repeat, dict.fromkeys((b"late-\xff", b"late-\xfe", b"late-string"), now_server()))
        deadline = time.monotonic() + 20  # late-\xff has no hash: a dangling entry, dropped
        while len(r.hkeys(q.keys.repeat_quarantine)) < len(bad) + 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
    finally:
        s.stop()
        await task
    got = fires(r, q.name)
    assert Counter(f.envelope.id for f in got).most_common(1)[0][1] == 1
    for k in good:
        times = [f.scheduled_ms for f in got if f.name == k]
        assert len(times) >= 5, (k, times)
        assert {b - a for a, b in zip(times, times[1:])} == {interval}, (k, times)  # each window once, in order
    moved = set(r.hkeys(q.keys.repeat_quarantine))
    assert moved == set(bad) | {b"late-string", b"late-\xfe"}
    assert s.quarantined_total == len(moved)
    assert r.zscore(q.keys.repeat, b"late-\xff") is None  # no spec hash: dropped as dangling
    assert set(r.zrange(q.keys.repeat, 0, -1)) == {k.encode() for k in good}


@pytest.mark.timeout(60)
def test_a_spoiled_paused_set_never_takes_a_spec_off_its_schedule(q: SyncQueue, r: redis.Redis) -> None:
    """``pause_repeatable`` took the spec out of ``repeat`` and then failed on a ``repeat:paused``
    of another type: the spec stopped firing and could not be resumed.  Now the pause is refused
    before the move; a re-upsert and a removal skip the spoiled set (it holds no paused spec);
    an upsert into a ``repeat`` of another type is refused before any spec hash is written."""
    key = q.upsert_repeatable_job("tick", 1, repeat=RepeatPattern.every(SECOND), key="tick").id
    assert r.zscore(q.keys.repeat, key) is not None
    r.set(q.keys.repeat_paused, b"\xff junk")
    with pytest.raises(ScriptError, match="pause_repeatable: .*repeat:paused is a string, not a zset"):
        q.pause_repeatable(key)
    assert r.zscore(q.keys.repeat, key) is not None, "the refused pause took the spec off its schedule"
    again = q.upsert_repeatable_job("tick", 2, repeat=RepeatPattern.every(SECOND), key="tick").id
    assert again == key and r.zscore(q.keys.repeat, key) is not None
    assert q.remove_repeatable_by_key(key) is True
    assert r.zscore(q.keys.repeat, key) is None and not r.exists(spec_hash(q, key.encode()))
    assert r.get(q.keys.repeat_paused) == b"\xff junk"  # foreign data is left alone

    r.delete(q.keys.repeat_paused)
    r.set(q.keys.repeat, b"junk")
    with pytest.raises(ScriptError, match="upsert_repeatable: .*repeat is a string, not a zset"):
        q.upsert_repeatable_job("tick", 3, repeat=RepeatPattern.every(SECOND), key="tick")
    assert not r.exists(spec_hash(q, key.encode())), "a spec hash was written that no scheduler will fire"
    r.delete(q.keys.repeat)
    q.upsert_repeatable_job("tick", 3, repeat=RepeatPattern.every(SECOND), key="tick")
    assert q.pause_repeatable(key) is True
    assert r.zscore(q.keys.repeat, key) is None and r.zscore(q.keys.repeat_paused, key) is not None
    assert q.resume_repeatable(key) is True and r.zscore(q.keys.repeat, key) is not None
