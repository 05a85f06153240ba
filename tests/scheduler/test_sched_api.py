"""The spec API of ``Queue`` and its twin ``SyncQueue``: upsert (and its errors), get, list
with a cursor, pause, resume, trigger, remove, bulk; stored bytes stay ChasquiMQ's."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
import redis
from sched_support import fires
from wire_vectors import V1

from airflow_provider_chasqui import BackoffSpec, MissedFiresPolicy, Queue, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.codec import decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.repeat import RepeatableMeta, StoredSpec
from airflow_provider_chasqui.core.sharding import shard_of
from airflow_provider_chasqui.core.spec_ext import SpecExt
from airflow_provider_chasqui.core.spec_reads import RepeatableInfo
from airflow_provider_chasqui.engine.sharded import ShardedQueue
from airflow_provider_chasqui.errors import CodecError, ConfigError
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue

# Test vectors V10 and V11 of the wire spec (section 23): StoredSpec bytes.
V10 = bytes.fromhex(
    """
98 b3 72 65 70 6f 72 74 3a 3a 65 76 65 72 79 3a 36 30 30 30 30 a6 72 65 70 6f 72 74 81 a5 45 76
65 72 79 91 cd ea 60 c4 16 c4 14 81 a2 74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d c0
c0 c0 00""".replace("\n", " ")
)
V11 = bytes.fromhex(
    """
99 d9 28 6e 69 67 68 74 6c 79 3a 3a 63 72 6f 6e 3a 30 20 32 20 2a 20 2a 20 2a 3a 41 6d 65 72 69
63 61 2f 4e 65 77 5f 59 6f 72 6b a7 6e 69 67 68 74 6c 79 81 a4 43 72 6f 6e 92 a9 30 20 32 20 2a
20 2a 20 2a b0 41 6d 65 72 69 63 61 2f 4e 65 77 5f 59 6f 72 6b c4 16 c4 14 81 a2 74 6f af 61 64
61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d 0a c0 cf 00 00 01 b8 da c5 b4 00 00 81 a7 46 69 72 65 41
6c 6c 91 64""".replace("\n", " ")
)


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[SyncQueue]:
    with SyncQueue(queue_name, redis_url=redis_url) as queue:
        yield queue


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- upsert --------------------------------------------------------------------------------


def test_upsert_stores_v10_bytes_and_returns_the_key(q: SyncQueue, r: redis.Redis) -> None:
    before = now_ms()
    job = q.upsert_repeatable_job("report", {"to": "ada@example.com"}, repeat=RepeatPattern.every(60_000))
    assert job.id == "report::every:60000" and job.name == "report"
    raw = r.hget(q.keys.repeat_spec(job.id), "spec")
    assert raw == V10  # the payload is bin(bin(V1)), no limit or window, Skip: an 8-element array
    assert StoredSpec.decode(raw).payload_inner == V1
    score = r.zscore(q.keys.repeat, job.id)
    assert before + 60_000 <= score <= now_ms() + 60_000
    assert not r.hexists(q.keys.repeat_spec(job.id), "ext")  # no extension: pure ChasquiMQ bytes


async def test_upsert_stores_v11_bytes_from_both_twins(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    kwargs = dict(
        repeat=RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
        limit=10,
        end_before_ms=1_893_456_000_000,
        missed_fires=MissedFiresPolicy.fire_all(100),
    )
    k = QueueKeys.for_queue(queue_name)
    async with Queue(queue_name, redis_url=redis_url) as aq:
        job = await aq.upsert_repeatable_job("nightly", {"to": "ada@example.com"}, **kwargs)
    assert job.id == "nightly::cron:0 2 * * *:America/New_York"
    assert r.hget(k.repeat_spec(job.id), "spec") == V11
    r.delete(k.repeat_spec(job.id))
    with SyncQueue(queue_name, redis_url=redis_url) as sq:
        sq.upsert_repeatable_bulk([{"name": "nightly", "data": {"to": "ada@example.com"}, **kwargs}])
    assert r.hget(k.repeat_spec(job.id), "spec") == V11


def test_upsert_with_every_option(q: SyncQueue, r: redis.Redis) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    job = q.upsert_repeatable_job(
        "nightly",
        [1, 2],
        repeat=RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
        limit=10,
        start_after=start,
        end_before_ms=1_924_992_000_000,
        missed_fires=MissedFiresPolicy.fire_all(100),
        attempts=5,
        backoff=BackoffSpec.exponential(250, multiplier=3.0, max_ms=10_000, jitter_ms=50),
        deadline=timedelta(minutes=2),
    )
    assert job.id == "nightly::cron:0 2 * * *:America/New_York"
    info = q.get_repeatable_job(job.id)
    assert isinstance(info, RepeatableInfo) and isinstance(info, RepeatableMeta)
    assert (info.limit, info.start_after_ms, info.end_before_ms) == (10, 1_893_456_000_000, 1_924_992_000_000)
    assert info.missed_fires == MissedFiresPolicy.fire_all(100)
    assert info.next_fire_ms == 1_893_481_200_000  # 2030-01-01 02:00 EST
    assert (info.attempts, info.deadline_ms, info.data, info.paused, info.fired) == (5, 120_000, [1, 2], False, 0)
    assert info.backoff == BackoffSpec("exponential", 250, 10_000, 3.0, 50)
    ext = SpecExt.decode(r.hget(q.keys.repeat_spec(job.id), "ext"))
    assert ext.retry is not None and ext.retry.max_attempts == 5 and ext.deadline_ms == 120_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repeat": RepeatPattern(kind="cron", expression="61 * * * *")}, "invalid cron"),
        ({"repeat": {"kind": "cron", "expression": "* * *"}}, "expected 5 fields"),
        ({"repeat": {"kind": "cron", "expression": "0 2 * * *", "tz": "Mars/Olympus"}}, "unknown timezone"),
        ({"repeat": {"kind": "every", "interval_ms": 0}}, "interval_ms must be an int from 1 to 2"),
        ({"repeat": {"kind": "every", "interval_ms": -5}}, "interval_ms must be an int from 1 to 2"),
        (
            {
                "repeat": RepeatPattern.every(1000),
                "start_after_ms": 2_000_000_000_000,
                "end_before_ms": 1_999_000_000_000,
            },
            "must be after start_after",
        ),
        ({"repeat": RepeatPattern.every(1000), "end_before_ms": 1_000}, "in the past"),
        ({"repeat": RepeatPattern.cron("0 0 30 2 *")}, "no future fire"),
        ({"repeat": RepeatPattern.every(86_400_000), "end_before_ms": now_ms() + 43_200_000}, "after end_before"),
        ({"repeat": RepeatPattern.every(1000), "limit": 0}, "limit must be a positive int"),
        ({"repeat": RepeatPattern.every(1000), "deadline": 0}, "deadline must be at least 1 ms"),
        ({"repeat": RepeatPattern.every(1000), "deadline": 2**64}, "deadline must be at most 2"),  # was OverflowError
        ({"repeat": RepeatPattern.every(1000), "deadline": 1e308}, "deadline must be at most 2"),
        ({"repeat": RepeatPattern.every(1000), "start_after": 5, "start_after_ms": 5}, "either start_after"),
        ({"repeat": None}, "repeat is required"),
        ({"repeat": RepeatPattern.every(1000), "missed_fires": "sometimes"}, "unknown missed_fires"),
    ],
)
def test_bad_specs_fail_at_upsert_and_write_nothing(q: SyncQueue, r: redis.Redis, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        q.upsert_repeatable_job("bad", {}, **kwargs)
    assert not r.exists(q.keys.repeat)


def test_bulk_validates_each_chunk_before_sending_it(q: SyncQueue, r: redis.Redis) -> None:
    good = [{"name": f"j{i}", "data": i, "repeat": RepeatPattern.every(1000 + i)} for i in range(2500)]
    bad = {"name": "x", "data": 1, "repeat": {"kind": "every", "interval_ms": 0}}
    with pytest.raises(ConfigError):
        q.upsert_repeatable_bulk([*good[:999], bad])
    assert not r.exists(q.keys.repeat)  # one chunk: nothing written
    with pytest.raises(ConfigError):
        q.upsert_repeatable_bulk([*good, bad])
    assert r.zcard(q.keys.repeat) == 2000  # the chunks before the bad one's are written, its own is not
    with pytest.raises(ConfigError, match="unknown upsert_repeatable_bulk keys"):
        q.upsert_repeatable_bulk([{"name": "x", "repeat": RepeatPattern.every(5), "cron": "* * * * *"}])
    keys = q.upsert_repeatable_bulk(good)
    assert keys == [f"j{i}::every:{1000 + i}" for i in range(2500)]
    assert r.zcard(q.keys.repeat) == 2500


def test_add_with_repeat_upserts_and_job_id_names_the_spec(q: SyncQueue) -> None:
    job = q.add("tick", {"n": 1}, repeat=RepeatPattern.every(5000), attempts=2)
    assert job.id == "tick::every:5000"  # as chasquimq 1.3: the key is derived from name and pattern
    assert q.get_repeatable_job(job.id).attempts == 2
    # chasquimq 1.3 drops job_id here; it names the spec instead (the returned Job's id is its key)
    named = q.add("tick", {"n": 2}, repeat=RepeatPattern.every(5000), job_id="tick-named", attempts=3)
    assert named.id == "tick-named" and q.get_repeatable_job("tick-named").attempts == 3
    assert {m.key for m in q.get_repeatable_jobs()} == {"tick::every:5000", "tick-named"}


def _key_on_another_shard(derived: str, shards: int) -> str:
    """A spec key that lands on another shard than ``derived`` (so routing by the wrong one misses)."""
    return next(k for k in (f"named-{i}" for i in range(100)) if shard_of(k, shards) != shard_of(derived, shards))


def test_sharded_queues_route_a_spec_named_by_job_id_to_its_key_s_shard(redis_url: str, queue_name: str) -> None:
    """``job_id`` names a repeatable spec on a sharded queue too: the spec, its bulk form and the
    lookups all use the shard of that key (they used the derived key's shard: the spec was
    written where ``get_repeatable_job`` does not look).  Options ``add`` does not take with
    ``repeat`` are refused as ``Queue.add`` refuses them, not dropped."""
    pattern = RepeatPattern.every(5000)
    named = _key_on_another_shard("tick::every:5000", 4)
    with SyncShardedQueue(queue_name, 4, redis_url=redis_url) as sq:
        assert sq.add("tick", {}, repeat=pattern, job_id=named, attempts=2).id == named
        assert sq.get_repeatable_job(named).attempts == 2
        assert sq.upsert_repeatable_bulk([{"name": "tock", "repeat": pattern, "job_id": named + "-b"}]) == [
            named + "-b"
        ]
        assert sq.get_repeatable_job(named + "-b") is not None
        with pytest.raises(ConfigError, match="do not apply to a repeatable spec"):
            sq.add("tick", {}, repeat=pattern, delay=5)
        assert sq.remove_repeatable_by_key(named) and sq.remove_repeatable_by_key(named + "-b")

    async def twin() -> None:
        async with ShardedQueue(queue_name + "-a", 4, redis_url=redis_url) as aq:
            job = await aq.upsert_repeatable_job("tick", {}, repeat=pattern, job_id=named)
            assert job.id == named and (await aq.get_repeatable_job(named)) is not None
            with pytest.raises(ConfigError, match="do not apply to a repeatable spec"):
                await aq.add("tick", {}, repeat=pattern, delay_ms=5)
            assert await aq.remove_repeatable_by_key(named)

    asyncio.run(twin())


# ---- read, pause, resume, trigger, remove ----------------------------------------------------


def test_list_pages_cover_every_spec_once_active_then_paused(q: SyncQueue) -> None:
    q.upsert_repeatable_bulk(
        [{"name": "s", "data": i, "key": f"k{i:04}", "repeat": RepeatPattern.every(60_000)} for i in range(1050)]
    )
    for i in range(0, 1050, 7):
        assert q.pause_repeatable(f"k{i:04}")
    seen: list[RepeatableInfo] = []
    cursor = None
    pages = 0
    while True:
        items, cursor = q.list_repeatable(cursor, count=100)
        assert len(items) <= 300  # bounded pages (ZSCAN COUNT is a hint)
        seen += items
        pages += 1
        if cursor is None:
            break
    assert pages >= 5
    assert sorted(i.key for i in seen) == [f"k{i:04}" for i in range(1050)]
    assert {i.key for i in seen if i.paused} == {f"k{i:04}" for i in range(0, 1050, 7)}
    with pytest.raises(ConfigError, match="invalid cursor"):
        q.list_repeatable("nonsense")
    with pytest.raises(ConfigError):
        q.list_repeatable(None, count=0)


def test_get_repeatable_jobs_lists_active_specs_by_next_fire(q: SyncQueue) -> None:
    q.upsert_repeatable_job("a", 1, repeat=RepeatPattern.every(30_000))
    q.upsert_repeatable_job("b", 2, repeat=RepeatPattern.every(10_000))
    q.upsert_repeatable_job("c", 3, repeat=RepeatPattern.every(20_000))
    q.pause_repeatable("c::every:20000")
    metas = q.get_repeatable_jobs()
    assert [m.key for m in metas] == ["b::every:10000", "a::every:30000"]
    assert all(type(m) is RepeatableMeta for m in metas)
    assert [m.key for m in q.get_repeatable_jobs(limit=1)] == ["b::every:10000"]


def test_pause_resume_keeps_the_interval_phase(q: SyncQueue, r: redis.Redis) -> None:
    job = q.upsert_repeatable_job("p", None, repeat=RepeatPattern.every(1000))
    first = r.zscore(q.keys.repeat, job.id)
    assert q.pause_repeatable(job.id) and q.pause_repeatable(job.id)  # idempotent
    info = q.get_repeatable_job(job.id)
    assert info.paused and info.next_fire_ms == first
    assert r.zscore(q.keys.repeat, job.id) is None  # invisible to every scheduler
    time.sleep(1.2)
    assert q.resume_repeatable(job.id) and q.resume_repeatable(job.id)
    nxt = r.zscore(q.keys.repeat, job.id)
    assert nxt > now_ms() - 5 and (nxt - first) % 1000 == 0
    assert not q.pause_repeatable("missing") and not q.resume_repeatable("missing")


def test_trigger_fires_one_job_without_touching_the_schedule(q: SyncQueue, r: redis.Redis) -> None:
    job = q.upsert_repeatable_job("t", {"x": 1}, repeat=RepeatPattern.every(3_600_000), attempts=4, key="trig")
    score = r.zscore(q.keys.repeat, "trig")
    q.pause_repeatable("trig")
    fired = q.trigger_repeatable("trig")
    assert fired is not None and fired.name == "t" and fired.data == {"x": 1}
    (f,) = fires(r, q.name)
    assert f.name == "t" and f.envelope.id == fired.id and f.envelope.retry.max_attempts == 4
    info = q.get_repeatable_job("trig")
    assert info.paused and info.fired == 0 and info.next_fire_ms == score
    assert q.trigger_repeatable("nothing") is None
    assert job.id == "trig"


def test_update_moves_the_timeline_and_remove_deletes(q: SyncQueue, r: redis.Redis) -> None:
    q.upsert_repeatable_job("u", 1, repeat=RepeatPattern.every(60_000), key="upd")
    r.hset(q.keys.repeat_spec("upd"), "fired", 2)
    q.upsert_repeatable_job("u", 2, repeat=RepeatPattern.every(5_000), key="upd", attempts=1)
    info = q.get_repeatable_job("upd")
    assert info.pattern == RepeatPattern.every(5_000) and info.data == 2 and info.fired == 2
    assert info.next_fire_ms <= now_ms() + 5_000
    q.upsert_repeatable_job("u", 3, repeat=RepeatPattern.every(5_000), key="upd")  # overrides dropped
    assert q.get_repeatable_job("upd").attempts is None
    assert q.remove_repeatable_by_key("upd") and not q.remove_repeatable_by_key("upd")
    assert q.get_repeatable_job("upd") is None
    assert not r.exists(q.keys.repeat_spec("upd"))


def test_undecodable_spec_is_reported_by_get_and_list_and_skipped_by_meta(q: SyncQueue, r: redis.Redis) -> None:
    q.upsert_repeatable_job("ok", 1, repeat=RepeatPattern.every(60_000))
    r.zadd(q.keys.repeat, {"bad": 1})
    r.hset(q.keys.repeat_spec("bad"), "spec", msgpack.packb([1, 2, 3]))
    with pytest.raises(CodecError):
        q.get_repeatable_job("bad")
    assert [m.key for m in q.get_repeatable_jobs()] == ["ok::every:60000"]
    items, _ = q.list_repeatable()
    assert [(i.key, i.corrupt) for i in items] == [("bad", True), ("ok::every:60000", False)]
    assert "stored spec must be an array of 8 or 9 elements" in items[0].reason


async def test_async_queue_is_the_same(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as aq:
        job = await aq.upsert_repeatable_job("a", {"v": 1}, repeat=RepeatPattern.cron("*/5 * * * *", tz="+05:30"))
        assert job.id == "a::cron:*/5 * * * *:+05:30"
        keys = await aq.upsert_repeatable_bulk([{"name": "b", "data": 2, "repeat": RepeatPattern.every(1000)}])
        assert keys == ["b::every:1000"]
        assert (await aq.get_repeatable_job(job.id)).data == {"v": 1}
        assert len(await aq.get_repeatable_jobs()) == 2
        items, cursor = await aq.list_repeatable(count=10)
        assert len(items) == 2 and cursor is None
        assert await aq.pause_repeatable(job.id) and await aq.resume_repeatable(job.id)
        fired = await aq.trigger_repeatable(job.id)
        assert decode_envelope(fires_of(redis_url, queue_name)[0]).id == fired.id
        assert await aq.get_quarantined() == {}
        assert await aq.remove_repeatable_by_key(job.id)


def fires_of(url: str, queue: str) -> list[bytes]:
    with redis.Redis.from_url(url) as r:
        return [f[b"d"] for _i, f in r.xrange(QueueKeys.for_queue(queue).stream)]


# ---- twins ---------------------------------------------------------------------------------

SPEC_METHODS = (
    "upsert_repeatable_job",
    "upsert_repeatable_bulk",
    "get_repeatable_job",
    "get_repeatable_jobs",
    "list_repeatable",
    "remove_repeatable_by_key",
    "pause_repeatable",
    "resume_repeatable",
    "trigger_repeatable",
    "get_quarantined",
)


@pytest.mark.parametrize(("async_cls", "sync_cls"), [(Queue, SyncQueue), (ShardedQueue, SyncShardedQueue)])
def test_async_and_sync_classes_are_twins(async_cls: type, sync_cls: type) -> None:
    for name in SPEC_METHODS:
        a, s = getattr(async_cls, name), getattr(sync_cls, name)
        assert inspect.iscoroutinefunction(a) and not inspect.iscoroutinefunction(s), name
        assert inspect.signature(a) == inspect.signature(s), name
    public = {n for n in dir(async_cls) if not n.startswith("_")} - {"__aenter__", "__aexit__"}
    assert public == {n for n in dir(sync_cls) if not n.startswith("_")}
