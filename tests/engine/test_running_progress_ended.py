"""Progress reported after its attempt ended (``engine/progress.SlotProgress``).

A ``Job`` reports through its worker slot, which takes reports only while that attempt runs
there.  Before, a task the handler left running, a thread past its timeout or a handler left
behind (``engine/running_control.py``) went on writing after the job's outcome: ``progress``
events after ``completed``, and a stale attempt's values over its retry's progress, on the
job page, ``chasqui job show`` and a deferred sensor's log.  Now such a report raises
``RuntimeError`` and writes nothing, which also ends a reporting loop that ignores its stop.
Real servers, in-process workers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from engine_support import events_of, running, wait_until

pytestmark = pytest.mark.timeout(120)


async def _job_events(clients, url: str, queue: str, job_id: str) -> list[dict[str, str]]:
    return [e for e in await events_of(clients(url), queue) if e.get("id") == job_id]


async def test_a_task_the_handler_left_reporting_stops_at_its_job_s_end(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """A handler starts a task that reports every 10 ms and returns without stopping it: the
    task's first report after the job completed raises ``RuntimeError`` (the task ends), the
    stored progress is the last value reported while the job ran, and no ``progress`` event
    follows ``completed``.  A report on the kept ``Job`` raises the same way."""
    q = queues(queue_name, redis_url)
    beats: list[asyncio.Task[None]] = []
    kept = []
    last_sent: list[int] = []

    async def h(job):
        if job.name == "marker":  # settled after the first: every report it had left is written
            return "m"

        async def beat() -> None:
            for i in range(100_000):
                await job.update_progress(i)
                last_sent.append(i)
                await asyncio.sleep(0.01)

        beats.append(asyncio.create_task(beat()))  # left running by mistake
        kept.append(job)
        await asyncio.sleep(0.4)
        return "done"

    async with running(worker_factory(queue_name, h, redis_url, store_results=True)):
        job = await q.add("p", {})
        assert await job.wait_for_result(timeout=30) == "done"
        with pytest.raises(RuntimeError, match=f"job {job.id} attempt 1 has ended"):
            await asyncio.wait_for(beats[0], 30)
        with pytest.raises(RuntimeError, match="has ended"):
            await kept[0].update_progress(100)
        marker = await q.add("marker", {})
        assert await marker.wait_for_result(timeout=30) == "m"
    assert last_sent and (await q.get_job_details(job.id)).progress == last_sent[-1]
    kinds = [e["e"] for e in await _job_events(clients, redis_url, queue_name, job.id)]
    assert kinds[-1] == "completed" and "progress" in kinds, kinds


async def test_a_left_behind_attempt_cannot_report_over_its_retry(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """Attempt 1 swallows its timeout's cancellation and keeps reporting; left behind, its job
    is retried and attempt 2 reports and completes.  Attempt 1's reports raise from the moment
    it was left behind (so its loop ends: its reports were what it did not swallow), and every
    ``progress`` event after attempt 1's ``failed`` comes from attempt 2, whose value is kept."""
    q = queues(queue_name, redis_url)
    ended: list[BaseException] = []

    async def h(job):
        if job.attempt > 0:
            await job.update_progress({"attempt": 2})
            await asyncio.sleep(0.05)  # within its 300 ms timeout
            return "second"
        give_up = time.monotonic() + 60
        try:
            while time.monotonic() < give_up:
                try:
                    await job.update_progress({"attempt": 1, "at": time.monotonic()})
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:  # the hostile part
                    pass
        except RuntimeError as exc:
            ended.append(exc)
            raise
        return "never"

    worker = worker_factory(queue_name, h, redis_url, concurrency=2, store_results=True)
    async with running(worker):
        job = await q.add("p", {}, timeout_ms=300, attempts=2, backoff=50)
        assert await job.wait_for_result(timeout=30) == "second"
        await wait_until(lambda: ended, 30, what="attempt 1's report to raise")
        await wait_until(lambda: worker.left_running == 0, 30, what="the left-behind handler to end")
    assert "attempt 1 has ended" in str(ended[0])
    assert (await q.get_job_details(job.id)).progress == {"attempt": 2}
    events = await _job_events(clients, redis_url, queue_name, job.id)
    failed_at = next(i for i, e in enumerate(events) if e["e"] == "failed")
    late = [json.loads(e["progress"]) for e in events[failed_at:] if e["e"] == "progress"]
    assert late and all(p == {"attempt": 2} for p in late), late


async def test_a_thread_past_its_timeout_stops_at_its_next_report(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A plain handler cannot be stopped in its thread; one that reports progress in its loop
    gets ``RuntimeError`` at the first report after its timeout, so its thread ends there (the
    worker's ``left_running`` count goes back to 0) instead of running on to its own end."""
    q = queues(queue_name, redis_url)
    stopped = threading.Event()
    reasons: list[str] = []

    def plain(job):
        give_up = time.monotonic() + 60
        try:
            while time.monotonic() < give_up:
                job.update_progress_sync(time.monotonic())
                time.sleep(0.02)
        except RuntimeError as exc:
            reasons.append(str(exc))
            raise
        finally:
            stopped.set()
        return "never"

    worker = worker_factory(queue_name, plain, redis_url, store_results=True)
    async with running(worker):
        job = await q.add("p", {}, timeout_ms=300, attempts=1)
        failure = await wait_until(lambda: q.get_failure(job.id), 30, what="the job dead-lettered")
        assert failure.error.startswith("timeout:")
        await wait_until(stopped.is_set, 30, what="the thread to stop at its next report")
        await wait_until(lambda: worker.left_running == 0, 30, what="no thread left running")
    assert reasons and "has ended" in reasons[0]
