"""Several workers on one queue, jobs finishing out of order and an older entry stuck with a
dead consumer: every job runs, gets one ``completed`` event, and the stream ends empty.

The acks delete entries by trimming below the group's oldest pending entry when that is
safe (``lua/complete_batch.lua``); these runs interleave the pending entries of several
consumers so that any entry trimmed before it was processed would show up as a lost job.
Matrix: Redis 7.0, Valkey 8.1, Redis 8.2 (XACKDEL), fast paths forced off and detected.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from engine_support import raw_async, running, wait_until

from airflow_provider_chasqui import Job
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine.queue import Queue
from airflow_provider_chasqui.engine.worker import Worker

pytestmark = pytest.mark.timeout(180)


async def _completed(r, k: QueueKeys) -> Counter:
    return Counter(f[b"id"] for _e, f in await r.xrange(k.events) if f[b"e"] == b"completed")


async def test_workers_sharing_a_queue_lose_nothing(matrix_url, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = raw_async(matrix_url.url)
    q = Queue(queue_name, redis_url=matrix_url.url)
    seen: Counter = Counter()
    rng = random.Random(11)

    async def handler(job: Job) -> None:
        seen[job.id] += 1
        if rng.random() < 0.3:  # some finish later than jobs read after them
            await asyncio.sleep(rng.random() * 0.01)

    try:
        await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
        ids = [j.id for j in await q.add_bulk([{"name": "n", "data": {"i": i}} for i in range(40)])]
        # a consumer that dies holding the two oldest entries: they stay pending until reclaimed
        ghost = await r.xreadgroup("default", "ghost", {k.stream: ">"}, count=2)
        assert len(ghost[0][1]) == 2
        ids += [j.id for j in await q.add_bulk([{"name": "n", "data": {"i": i}} for i in range(40, 1200)])]
        workers = [
            Worker(
                queue_name,
                handler,
                redis_url=matrix_url.url,
                fast_paths=not matrix_url.force_compat,
                concurrency=8,
                read_count=16,
                ack_batch=24,
                claim_min_idle_ms=1500,
                run_scheduler=False,
                delayed_enabled=False,
            )
            for _ in range(3)
        ]
        async with running(workers[0]), running(workers[1]), running(workers[2]):

            async def all_done() -> bool:
                return len(await _completed(r, k)) == len(ids) and await r.xlen(k.stream) == 0

            await wait_until(all_done, timeout=60, what="every job completed and deleted")
        completed = await _completed(r, k)
        assert set(completed) == {i.encode() for i in ids}
        assert set(completed.values()) == {1}
        assert set(seen) == set(ids) and set(seen.values()) == {1}
        assert (await r.xpending(k.stream, "default"))["pending"] == 0
        assert sum(w.processed for w in workers) == len(ids)
    finally:
        await q.close()
        await r.aclose()
