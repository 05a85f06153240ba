"""The per-minute history (``core/history.py``, issue 28) as workers write it: counted where the
intake settles jobs, added to Redis with the beat and at a clean stop, read back by dashboards
started after the worker left (tests/dashboard/test_history.py bounds its bytes)."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui.core.history import HOUR_MS, MINUTE_MS
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
