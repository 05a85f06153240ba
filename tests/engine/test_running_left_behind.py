"""Handlers that ignore their cancellation (``engine/running_control.py``).

An ``async def`` handler is stopped by cancelling its slot, at its deadline or on
``Queue.cancel``.  One that swallows the ``CancelledError`` (a bare ``except:`` in a retry loop)
kept its slot and its job for as long as it ran: at ``concurrency=1`` the queue stood still
behind it, and ``asyncio.run`` never returned after the stop.  Now, ``LEAVE_BEHIND_MS`` after
the cancel, its job is settled without it (failed ``timeout``, or ``cancelled``), a new slot
runs the next jobs, and whatever the handler does when it ends at last settles nothing.
Real servers, in-process workers.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_support import events_of, running, wait_until

from airflow_provider_chasqui.core.codec import now_ms
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.liveness import read_workers
from airflow_provider_chasqui.core.running import BATCH_ATTR, CANCEL_POLL_SECS, LEAVE_BEHIND_MS

pytestmark = pytest.mark.timeout(120)

#: deadline (or cancel) + LEAVE_BEHIND_MS + a poll, with room for a loaded machine
_SETTLED_WITHIN = 0.5 + LEAVE_BEHIND_MS / 1000 + CANCEL_POLL_SECS + 2.0


class Stubborn:
    """An async handler (of one job or a batch) that swallows every cancellation until released,
    then returns ``"late"`` or raises, as ``ending`` says; ``"quick"`` jobs return at once."""

    def __init__(self, ending: str = "returns") -> None:
        self.ending = ending
        self.release = asyncio.Event()
        self.started: list[float] = []
        self.cancels = 0
        self.ended = asyncio.Event()
        self.quick: list[float] = []  # when each quick job started

    async def __call__(self, job):
        first = job[0] if isinstance(job, list) else job
        if first.name == "quick":
            self.quick.append(time.monotonic())
            return [first.data] * len(job) if isinstance(job, list) else first.data
        self.started.append(time.monotonic())
        give_up = time.monotonic() + 90  # never outlives its test, released or not
        try:
            while not self.release.is_set() and time.monotonic() < give_up:
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:  # the hostile part: the cancel is swallowed
                    self.cancels += 1
        finally:
            self.ended.set()
        if self.ending == "raises":
            raise RuntimeError("late failure")
        return ["late"] * len(job) if isinstance(job, list) else "late"


async def _kinds_of(clients, url: str, queue: str, job_id: str) -> list[str]:
    return [e["e"] for e in await events_of(clients(url), queue) if e.get("id") == job_id]


@pytest.mark.parametrize("ending", ["returns", "raises"])
async def test_a_timed_handler_ignoring_its_cancellation_is_left_behind_and_its_job_fails(
    ending: str, redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """At concurrency 1, a handler swallowing its timeout's cancellation: its job is dead-lettered
    for the timeout within ``_SETTLED_WITHIN`` s of its start, the job queued behind it runs on a
    new slot, and when the handler at last returns or raises, nothing more is written."""
    q = queues(queue_name, redis_url)
    h = Stubborn(ending)
    async with running(worker_factory(queue_name, h, redis_url, concurrency=1, store_results=True)):
        stuck = await q.add("stuck", {}, timeout_ms=500, attempts=1)
        behind = await q.add("quick", "behind")
        assert await behind.wait_for_result(timeout=30) == "behind"
        failure = await wait_until(lambda: q.get_failure(stuck.id), 30, what="the dead-lettered job")
        assert h.quick[0] - h.started[0] < _SETTLED_WITHIN  # the job behind it ran that soon
        assert h.cancels >= 1 and not h.ended.is_set()  # it saw the cancel, and still runs
        assert failure.reason == "retries_exhausted" and failure.error.startswith("timeout:")
        h.release.set()
        await asyncio.wait_for(h.ended.wait(), 30)
        after = await q.add("quick", "after")  # the worker runs on after the late ending
        assert await after.wait_for_result(timeout=30) == "after"
    assert h.started == h.started[:1]  # never run again
    assert await q.get_job_state(stuck.id) == "failed"
    assert await q.get_job_result(stuck.id) is None
    assert await _kinds_of(clients, redis_url, queue_name, stuck.id) == ["active", "failed", "dlq"]
    r = clients(redis_url)
    assert await r.xlen(QueueKeys.for_queue(queue_name).stream) == 0


async def test_a_cancelled_handler_ignoring_it_ends_cancelled_and_frees_its_slot(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """``Queue.cancel`` of a running handler that swallows the cancellation (no timeout): the job
    ends ``cancelled``, the next job runs in its place, and the late return stores nothing."""
    q = queues(queue_name, redis_url)
    h = Stubborn()
    async with running(worker_factory(queue_name, h, redis_url, concurrency=1, store_results=True)):
        stuck = await q.add("stuck", {}, attempts=3)
        await wait_until(lambda: h.started, 30, what="the stubborn job to start")
        t0 = time.monotonic()
        assert await q.cancel(stuck.id) == "requested"
        behind = await q.add("quick", "behind")
        assert await behind.wait_for_result(timeout=30) == "behind"
        await wait_until(lambda: _state_is(q, stuck.id, "cancelled"), 30, what="the job to end cancelled")
        assert h.quick[0] - t0 < _SETTLED_WITHIN
        assert h.cancels >= 1 and not h.ended.is_set()
        h.release.set()
        await asyncio.wait_for(h.ended.wait(), 30)
        after = await q.add("quick", "after")
        assert await after.wait_for_result(timeout=30) == "after"
    assert len(h.started) == 1
    assert await q.get_job_state(stuck.id) == "cancelled"
    kinds = await _kinds_of(clients, redis_url, queue_name, stuck.id)
    assert kinds == ["active", "cancelled"], kinds


async def _state_is(q, job_id: str, state: str) -> bool:
    return await q.get_job_state(job_id) == state


async def test_a_timed_batch_ignoring_its_cancellation_fails_every_job_of_its_call(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """A batch call swallowing its timeout's cancellation: each of its jobs fails with reason
    ``timeout`` (retried per its policy), and the worker's one slot goes on to the next jobs."""
    q = queues(queue_name, redis_url)
    h = Stubborn()
    setattr(h, BATCH_ATTR, 3)
    stuck = await q.add_bulk([{"name": "stuck", "data": i, "attempts": 1, "timeout_ms": 500} for i in range(3)])
    async with running(worker_factory(queue_name, h, redis_url, concurrency=1, store_results=True)):
        failures = [await wait_until(lambda j=j: q.get_failure(j.id), 30, what="a dead-lettered job") for j in stuck]
        behind = await q.add("quick", "behind")
        assert await behind.wait_for_result(timeout=30) == "behind"
        h.release.set()
        await asyncio.wait_for(h.ended.wait(), 30)
    assert len(h.started) == 1  # one call of three jobs
    assert all(f.error.startswith("timeout:") for f in failures), failures
    for j in stuck:
        assert await _kinds_of(clients, redis_url, queue_name, j.id) == ["active", "failed", "dlq"]


async def test_a_worker_with_a_slot_left_behind_stops_without_waiting_for_it(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """``close()`` does not wait out ``shutdown_deadline_secs`` for a left-behind handler (its job
    is settled): the worker stops at once while the handler still runs."""
    q = queues(queue_name, redis_url)
    h = Stubborn()
    worker = worker_factory(queue_name, h, redis_url, concurrency=2, shutdown_deadline_secs=30, store_results=True)
    task = asyncio.create_task(worker.run())
    try:
        stuck = await q.add("stuck", {}, timeout_ms=300, attempts=1)
        await wait_until(lambda: q.get_failure(stuck.id), 30, what="the dead-lettered job")
        t0 = time.monotonic()
        await worker.close()
        await asyncio.wait_for(task, 30)
        assert time.monotonic() - t0 < 10  # not the 30 s deadline
        assert not h.ended.is_set()  # the stop's extra cancel was swallowed too
    finally:
        h.release.set()
        await asyncio.wait_for(h.ended.wait(), 30)
        if not task.done():
            task.cancel()


class LeftRunningSink:
    """A metrics sink with the one method this test watches (the protocol lets a sink have some)."""

    def __init__(self) -> None:
        self.reports: list[int] = []

    def handlers_left_running(self, queue: str, n: int) -> None:
        self.reports.append(n)


async def test_handlers_running_on_after_their_job_are_counted_until_they_end(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A left-behind ``async def`` handler and a plain handler's thread past its timeout each
    count in ``Worker.left_running`` while they run on, and stop counting when they end: seen
    in ``health()``, in the heartbeat every viewer reads (``chasqui workers``, the dashboard)
    and by the metrics sink (``handlers_left_running``).  The worker stays healthy."""
    q = queues(queue_name, redis_url)
    stubborn = Stubborn()
    thread_free = threading.Event()

    def plain(job):
        thread_free.wait(90)  # a thread cannot be stopped; it ends when the test lets it
        return "late"

    sink = LeftRunningSink()
    handlers = {"stuck": stubborn, "quick": stubborn, "plain": plain}
    worker = worker_factory(
        queue_name, handlers, redis_url, concurrency=2, claim_min_idle_ms=2000, metrics=sink, store_results=True
    )

    async def beaten() -> int | None:
        records = await q.driver.run(read_workers(q.keys, now_ms()))
        return records[0].left_running if records else None

    try:
        async with running(worker):
            assert worker.left_running == 0 and "left_running" not in worker.health()
            stuck = await q.add("stuck", {}, timeout_ms=300, attempts=1)
            await wait_until(lambda: q.get_failure(stuck.id), 30, what="the stubborn job dead-lettered")
            assert worker.left_running == 1 and not stubborn.ended.is_set()
            health = worker.health()
            assert health["ok"] is True and health["left_running"] == "1 handler running on after their job ended"
            await wait_until(lambda: _is(beaten(), 1), 30, what="the heartbeat to say 1")
            blocked = await q.add("plain", {}, timeout_ms=300, attempts=1)
            await wait_until(lambda: q.get_failure(blocked.id), 30, what="the plain job dead-lettered")
            await wait_until(lambda: worker.left_running == 2, 30, what="the thread counted")
            await wait_until(lambda: _is(beaten(), 2), 30, what="the heartbeat to say 2")
            await wait_until(lambda: sink.reports[-1:] == [2], 30, what="the metric at 2")
            behind = await q.add("quick", "behind")  # both slots were replaced: the queue runs on
            assert await behind.wait_for_result(timeout=30) == "behind"
            stubborn.release.set()
            await asyncio.wait_for(stubborn.ended.wait(), 30)
            await wait_until(lambda: worker.left_running == 1, 30, what="the coroutine's end counted")
            thread_free.set()
            await wait_until(lambda: worker.left_running == 0, 30, what="the thread's end counted")
            assert "left_running" not in worker.health()
            await wait_until(lambda: _is(beaten(), 0), 30, what="the heartbeat back at 0")
            await wait_until(lambda: sink.reports[-1:] == [0], 30, what="the metric back at 0")
    finally:
        stubborn.release.set()
        thread_free.set()
    # changes only (sampled every CANCEL_POLL_SECS: the 1 between the two ends may fall between polls)
    assert sink.reports[:2] == [1, 2] and sink.reports[-1] == 0, sink.reports
    assert all(a != b for a, b in zip(sink.reports, sink.reports[1:])), sink.reports


async def _is(value, want) -> bool:
    return await value == want
