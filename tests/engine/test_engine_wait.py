"""Waiting for outcomes: the handler's error reaches the waiter, and a failure ends the wait early."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_chasqui import JobFailed
from tests.engine_support import running


async def test_failure_detail_and_stop_on_failure(redis_url: str, queue_name: str, queues, worker_factory) -> None:
    release = asyncio.Event()

    async def handler(job):
        if job.name == "explode":
            raise ValueError("boom")
        await release.wait()  # the slow job stays running until the test is done
        return "late"

    q = queues(queue_name, redis_url)
    slow = await q.add("slow", 1)
    bad = await q.add("explode", 2, attempts=1)
    worker = worker_factory(queue_name, handler, redis_url, store_results=True, run_scheduler=False)
    async with running(worker):
        started = time.monotonic()
        outcomes = await q.wait_for_results([slow.id, bad.id], timeout=30, stop_on_failure=True)
        assert time.monotonic() - started < 15  # returned on the failure, not at the 30 s deadline
        assert slow.id not in outcomes
        status, reason, detail, tb = outcomes[bad.id]
        assert (status, reason) == ("failed", "retries_exhausted")
        assert detail == "handler: Python handler raised: ValueError('boom')"
        assert tb.startswith("Traceback (most recent call last):") and tb.endswith("ValueError: boom\n")
        assert 'raise ValueError("boom")' in tb  # the handler's own frame, with its source line
        with pytest.raises(JobFailed, match="boom") as info:
            await q.wait_for_result(bad.id, timeout=5)
        assert info.value.traceback == tb and "handler traceback" in str(info.value)
        failure = await q.get_failure(bad.id)
        assert failure is not None and (failure.job_id, failure.reason, failure.error, failure.traceback) == (
            bad.id,
            "retries_exhausted",
            detail,
            tb,
        )
        assert failure.finished_ms > 0 and await q.get_job_state(bad.id) == "failed"
        assert await q.get_failure(slow.id) is None
        release.set()
        assert await q.wait_for_result(slow.id, timeout=15) == "late"
