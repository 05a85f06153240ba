"""The per-minute history (``core/history.py``, issue 28) as workers write it: counted where the
intake settles jobs, added to Redis with the beat and at a clean stop, read back by dashboards
started after the worker left (tests/dashboard/test_history.py bounds its bytes)."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui.core.history import HOUR_MS, MINUTE_MS
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.dashboard.data import Source

pytestmark = pytest.mark.timeout(120)


async def test_the_history_outlives_the_worker_and_the_dashboard(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A worker runs 30 jobs (6 of them fail for good) and stops; a dashboard source made after
    it, and another after that one closed (a restart), both chart them in the current hour."""
    q = queues(queue_name, redis_url)

    async def h(job):
        if job.data % 5 == 0 and job.data < 35:
            raise ValueError("boom")
        return job.data

    async with running(worker_factory(queue_name, h, redis_url, max_attempts=1, store_results=True)):
        jobs = await q.add_bulk([{"name": "n", "data": i} for i in range(30)])
        for job in jobs:
            if job.data % 5:
                assert await q.wait_for_result(job.id, timeout=60) == job.data

        async def dead() -> bool:
            return len(await q.peek_dlq(50)) == 6

        await wait_until(dead, 60, what="6 jobs in the DLQ")
    for _ in range(2):  # the first dashboard, then a restarted one
        src = Source("t", redis_url)
        try:
            hour = await asyncio.to_thread(src.history, queue_name, HOUR_MS, MINUTE_MS)
            assert (hour.total_completed, hour.total_failed) == (24, 6), (hour.completed, hour.failed)
            assert len(hour.completed) == 60
        finally:
            src.close()


async def test_a_spoiled_beats_or_history_key_is_replaced_and_the_lease_loop_goes_on(
    redis_url: str, queue_name: str, clients, queues, worker_factory
) -> None:
    """The beat pipeline (heartbeat and history counts) rides on the lease loop.  A beats or
    history key of another type (hostile) made every beat fail: the lease task crashed and
    restarted in a loop and ``health()`` said not ok for as long as the key stayed.  Now the
    spoiled keys are replaced (the counts of that one beat are lost), the worker is listed and
    healthy, its jobs are counted, and a dashboard reading a spoiled hour sees no counts instead
    of failing."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    left_ms = HOUR_MS - int(time.time() * 1000) % HOUR_MS
    if left_ms < 60_000:  # the counts must land in the hour spoiled here: start in the next one
        await asyncio.sleep(left_ms / 1000 + 0.1)
    hour_key = k.history(int(time.time() * 1000) // HOUR_MS)
    await r.rpush(k.beats, "junk")
    await r.set(hour_key, "junk")
    done: list[int] = []

    async def h(job):
        done.append(job.data)

    w = worker_factory(queue_name, h, redis_url, claim_min_idle_ms=1500)
    async with running(w):
        await wait_until(lambda: w.health().get("ok"), 30, what="the worker consuming")

        async def listed() -> bool:
            return await r.type(k.beats) == b"zset" and await r.zscore(k.beats, w.consumer_id) is not None

        await wait_until(listed, 30, what="the beats key replaced and the worker listed")
        await q.add_bulk([{"name": "n", "data": i} for i in range(10)])
        await wait_until(lambda: len(done) == 10, 30, what="the first jobs")

        async def replaced() -> bool:  # by the first beat that counts jobs (its counts are lost)
            return not await r.exists(hour_key) or await r.type(hour_key) == b"hash"

        await wait_until(replaced, 30, what="the history hour replaced")
        await q.add_bulk([{"name": "n", "data": i} for i in range(10, 20)])
        await wait_until(lambda: len(done) == 20, 30, what="the later jobs")

        async def counted() -> bool:
            return await r.type(hour_key) == b"hash" and int(sum(map(int, (await r.hgetall(hour_key)).values()))) >= 10

        await wait_until(counted, 30, what="the later jobs counted")
        health = w.health()
        assert health["ok"] and health["lease"] is True, health
    src = Source("t", redis_url)
    try:
        hour = await asyncio.to_thread(src.history, queue_name, HOUR_MS, MINUTE_MS)
        assert 10 <= hour.total_completed <= 20, hour.completed  # the later jobs at least
        await r.delete(hour_key)
        await r.set(hour_key, "junk again")
        hour = await asyncio.to_thread(src.history, queue_name, HOUR_MS, MINUTE_MS)
        assert hour.total_completed == 0
    finally:
        src.close()
