"""Deduplication modes (issue 25, ``core/dedup.py``, ``lua/add_dedup.lua``): throttle and
debounce hold with several producers racing (tasks and threads), on real servers."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from engine_support import events_of, running, wait_until

from airflow_provider_chasqui import ConfigError, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)


async def test_throttle_adds_one_job_per_window_with_producers_racing(
    redis_url: str, queue_name: str, queues, clients
) -> None:
    """50 tasks and 8 threads add under one dedup id at once: one job, every caller gets its
    id, one ``deduplicated`` event per repeat; after the window a new job is added."""
    q = queues(queue_name, redis_url)
    jobs = await asyncio.gather(*(q.add("t", {"i": i}, dedup_id="nightly", dedup_ttl_ms=2000) for i in range(50)))

    def from_thread(i: int) -> str:
        with SyncQueue(queue_name, redis_url=redis_url) as sq:
            return sq.add("t", {"i": 100 + i}, dedup_id="nightly", dedup_mode="throttle", dedup_ttl_ms=2000).id

    with ThreadPoolExecutor(8) as pool:
        thread_ids = await asyncio.get_running_loop().run_in_executor(
            None, lambda: list(pool.map(from_thread, range(8)))
        )
    ids = {j.id for j in jobs} | set(thread_ids)
    assert len(ids) == 1
    r = clients(redis_url)
    keys = QueueKeys.for_queue(queue_name)
    assert await r.xlen(keys.stream) == 1
    dedup = [e for e in await events_of(r, queue_name) if e["e"] == "deduplicated"]
    assert len(dedup) == 57 and {e["id"] for e in dedup} == ids and {e["mode"] for e in dedup} == {"throttle"}
    await asyncio.sleep(2.2)
    later = await q.add("t", {"i": 999}, dedup_id="nightly", dedup_ttl_ms=2000)
    assert later.id not in ids and await r.xlen(keys.stream) == 2


async def test_debounce_runs_the_last_data_once_after_the_quiet_period(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """Ten adds 100 ms apart under a 600 ms debounce, then ten racing at once: each burst runs
    one job, with its last data, no sooner than 600 ms after the burst's last add."""
    q = queues(queue_name, redis_url)
    ran: list[tuple[int, float]] = []

    async def h(job):
        ran.append((job.data["i"], time.monotonic()))

    async with running(worker_factory(queue_name, h, redis_url, promoter_poll_ms=20)):
        last = None
        for i in range(10):
            last = await q.add("d", {"i": i}, dedup_id="save", dedup_mode="debounce", dedup_ttl_ms=600)
            last_at = time.monotonic()
            await asyncio.sleep(0.1)
        assert last is not None
        await wait_until(lambda: len(ran) == 1, 30, what="the debounced job")
        assert ran[0][0] == 9 and ran[0][1] - last_at >= 0.6 - 0.05
        racing = await asyncio.gather(
            *(q.add("d", {"i": 100 + i}, dedup_id="save", dedup_mode="debounce", dedup_ttl_ms=600) for i in range(10))
        )
        burst_end = time.monotonic()
        await wait_until(lambda: len(ran) == 2, 30, what="the second burst's job")
        await asyncio.sleep(1.0)  # a replaced job would have run by now too
    assert len(ran) == 2 and ran[1][0] >= 100 and ran[1][1] - burst_end >= 0.6 - 0.05
    dedup = [e for e in await events_of(clients(redis_url), queue_name) if e["e"] == "deduplicated"]
    assert len(dedup) == 18 and all(e["mode"] == "debounce" and e["replaced_by"] for e in dedup)
    assert racing[-1].id in {e["replaced_by"] for e in dedup} | {racing[-1].id}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"dedup_id": "", "dedup_ttl_ms": 100}, "dedup_id"),
        ({"dedup_id": "x" * 1025, "dedup_ttl_ms": 100}, "dedup_id"),
        ({"dedup_id": "a", "dedup_ttl_ms": None}, "dedup_ttl_ms"),
        ({"dedup_id": "a", "dedup_ttl_ms": 0}, "dedup_ttl_ms"),
        ({"dedup_id": "a", "dedup_ttl_ms": math.nan}, "dedup_ttl_ms"),
        ({"dedup_id": "a", "dedup_ttl_ms": math.inf}, "dedup_ttl_ms"),
        ({"dedup_id": "a", "dedup_ttl_ms": True}, "dedup_ttl_ms"),
        ({"dedup_id": "a", "dedup_ttl_ms": 100, "dedup_mode": "sometimes"}, "unknown dedup_mode"),
        ({"dedup_id": "a", "dedup_ttl_ms": 100, "delay": 5}, "cannot be combined with delay"),
        ({"dedup_id": "a", "dedup_ttl_ms": 100, "job_id": "j"}, "cannot be combined with job_id"),
        ({"dedup_id": "a", "dedup_ttl_ms": 100, "priority": 1}, "cannot be combined with priority"),
    ],
)
def test_bad_dedup_options_are_config_errors(options: dict, match: str, shared_redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=shared_redis_url) as q, pytest.raises(ConfigError, match=match):
        q.add("a", 1, **options)
    with redis.Redis.from_url(shared_redis_url) as r:
        assert r.xlen(QueueKeys.for_queue(queue_name).stream) == 0


@pytest.mark.single_node("writes a hostile marker with a plain client")
async def test_a_hostile_marker_is_replaced(redis_url: str, queue_name: str, queues, clients) -> None:
    keys = QueueKeys.for_queue(queue_name)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        await admin.rpush(keys.dedup("x"), b"junk")
        await admin.set(keys.dedup("y"), b"\xff")
        q = queues(queue_name, redis_url)
        a = await q.add("t", 1, dedup_id="x", dedup_ttl_ms=5000)
        b = await q.add("t", 2, dedup_id="y", dedup_mode="debounce", dedup_ttl_ms=5000)
        assert (await q.add("t", 3, dedup_id="x", dedup_ttl_ms=5000)).id == a.id
        r = clients(redis_url)
        assert await r.xlen(keys.stream) == 1 and await r.zcard(keys.delayed) == 1 and a.id != b.id
    finally:
        await admin.aclose()
