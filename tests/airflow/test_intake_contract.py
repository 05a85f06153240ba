"""The contract every user of the consumer intake (``engine/intake.py``) passes: the ``Worker``
and the Airflow queue-events watcher (``QueueModeProducer``) are run through the same six
scenarios on a real Redis, each with a 1 s lease:

* **reclaim**: an entry left pending by a dead consumer is delivered once the lease ran out;
* **lease loss**: an entry another consumer takes over while it is held is not settled by the
  user that lost it (XACK does not check ownership: acking it would delete the thief's job);
* **exhausted attempts**: an entry delivered too often is dead-lettered, never handed out;
* **NOGROUP**: the stream deleted under a running user: the group is recreated, later jobs run;
* **slow settle**: a job held three leases long (a slow handler, a slow Airflow save) is never
  reclaimed by another consumer meanwhile: the user's leases are renewed;
* **pause**: jobs of a paused queue reach neither user until the resume (``engine/flow_gate.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from engine_support import consumer_core, wait_until

from airflow_provider_chasqui.core.consumer import ConsumerCore
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.intake import Intake
from airflow_provider_chasqui.engine.queue import Queue
from airflow_provider_chasqui.engine.worker import Worker
from airflow_provider_chasqui.triggers._batching import AdvanceItem, AdvanceOutcome
from airflow_provider_chasqui.triggers.queue_watcher import QueueModeProducer

pytestmark = pytest.mark.timeout(90)
LEASE_MS = 1000
USERS = ["worker", "watcher"]


class User:
    """One intake user, started on ``queue``; ``seen`` lists the job ids handed to it, and each
    is held ``hold`` seconds (a handler's run, Airflow's save) before it is settled."""

    def __init__(self, kind: str, url: str, queue: str, hold: float = 0.0) -> None:
        self.kind, self.url, self.queue, self.hold = kind, url, queue, hold
        self.seen: list[str] = []
        self.settled: list[str] = []
        self._task: asyncio.Task[Any] | None = None
        self._worker: Worker | None = None
        self._producer: QueueModeProducer | None = None

    async def __aenter__(self) -> User:
        if self.kind == "worker":

            async def handler(job: Any) -> None:
                self.seen.append(job.id)
                await asyncio.sleep(self.hold)
                self.settled.append(job.id)

            self._worker = Worker(
                self.queue, handler, redis_url=self.url, claim_min_idle_ms=LEASE_MS, read_block_ms=200, concurrency=4
            )
            self._task = asyncio.create_task(self._worker.run())
        else:
            self._producer = QueueModeProducer(
                queue_name=self.queue, chasqui_conn_id="chasqui_default", claim_min_idle_ms=LEASE_MS, block_ms=200
            )
            self._task = asyncio.create_task(self._watch(self._producer))
        return self

    async def _watch(self, producer: QueueModeProducer) -> None:
        async for raw, payload in producer.open_stream():
            self.seen += [job.job_id for job in raw.jobs]
            await asyncio.sleep(self.hold)
            for job in raw.jobs:
                job.accepted += 1
            await producer.advance([AdvanceItem(payload, AdvanceOutcome(acked=1, failed=0))])
            self.settled += [job.job_id for job in raw.jobs]

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if self._worker is not None:
            await self._worker.close()
            await asyncio.wait_for(self._task, 30)
        else:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            assert self._producer is not None
            try:
                await asyncio.wait_for(self._producer.aclose(), 20)
            except TimeoutError:
                for task in asyncio.all_tasks():
                    task.print_stack()
                raise


def _core(queue: str, consumer: str) -> ConsumerCore:
    return consumer_core(queue, consumer_id=consumer, max_attempts=25)


@contextlib.asynccontextmanager
async def rival(url: str, queue: str, name: str = "rival") -> AsyncIterator[Intake]:
    """Another consumer of the group, driven by hand."""
    driver = AsyncDriver(url)
    try:
        it = Intake(driver, _core(queue, name), lease_ms=LEASE_MS)
        await it.open()
        yield it
    finally:
        await driver.close()


async def add(url: str, queue: str, n: int = 1) -> list[str]:
    async with Queue(queue, redis_url=url) as q:
        return [(await q.add("job", {"i": i})).id for i in range(n)]


def _r(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def _pending(url: str, queue: str) -> list[dict[str, Any]]:
    return _r(url).xpending_range(QueueKeys.for_queue(queue).stream, "default", "-", "+", 100)


@pytest.mark.parametrize("kind", USERS)
async def test_reclaim(kind: str, redis_url: str, queue_name: str) -> None:
    [job] = await add(redis_url, queue_name)
    async with rival(redis_url, queue_name, "dead") as dead:
        assert [dl.envelope.id for dl in await dead.next_batch(1, 10)] == [job]  # then it dies
    async with User(kind, redis_url, queue_name) as user:
        await wait_until(lambda: user.settled == [job], 20, what="the dead consumer's job reclaimed and settled")
        await wait_until(lambda: _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 0, 10)
    assert user.seen == [job]


@pytest.mark.parametrize("kind", USERS)
async def test_lease_loss(kind: str, redis_url: str, queue_name: str) -> None:
    async with User(kind, redis_url, queue_name, hold=2.0) as user, rival(redis_url, queue_name) as thief:
        [job] = await add(redis_url, queue_name)
        await wait_until(lambda: user.seen == [job], 20, what="the job handed to the user")
        taken = await thief.claim_idle(0, 10)  # taken over while the user still holds it...
        assert len(taken) == 1
        thief.in_flight.add(taken[0][0])
        leases = asyncio.create_task(thief.run_leases())  # ...by a live consumer, which renews it
        try:
            await wait_until(lambda: user.settled == [job], 20, what="the user to finish")
            await asyncio.sleep(0.5)  # a settle written now would have acked the thief's entry
        finally:
            leases.cancel()
        assert user.seen == [job]
        [entry] = _pending(redis_url, queue_name)
        assert entry["consumer"] == b"rival" and entry["message_id"] == taken[0][0]
        completed = [
            f for _id, f in _r(redis_url).xrange(QueueKeys.for_queue(queue_name).events) if f[b"e"] == b"completed"
        ]
        assert completed == []


@pytest.mark.parametrize("kind", USERS)
async def test_exhausted_attempts(kind: str, redis_url: str, queue_name: str) -> None:
    [job] = await add(redis_url, queue_name)
    k = QueueKeys.for_queue(queue_name)
    async with rival(redis_url, queue_name, "dead") as dead:
        [dl] = await dead.next_batch(1, 10)
    _r(redis_url).xclaim(k.stream, "default", "dead", 0, [dl.entry_id], retrycount=99)
    async with User(kind, redis_url, queue_name) as user:
        await wait_until(lambda: _r(redis_url).xlen(k.dlq) == 1, 20, what="the exhausted job dead-lettered")
    [(_id, fields)] = _r(redis_url).xrange(k.dlq)
    assert fields[b"reason"] == b"retries_exhausted" and user.seen == []
    assert _pending(redis_url, queue_name) == [] and _r(redis_url).xlen(k.stream) == 0


@pytest.mark.parametrize("kind", USERS)
async def test_nogroup_recovery(kind: str, redis_url: str, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    async with User(kind, redis_url, queue_name) as user:
        first = await add(redis_url, queue_name)
        await wait_until(lambda: user.settled == first, 20, what="the first job")
        _r(redis_url).delete(k.stream)  # the group goes with it
        await asyncio.sleep(0.5)  # the user reads into the void (NOGROUP) meanwhile
        later = await add(redis_url, queue_name, 3)
        await wait_until(lambda: sorted(user.settled) == sorted(first + later), 20, what="the later jobs")


@pytest.mark.parametrize("kind", USERS)
async def test_slow_settle_longer_than_the_lease(kind: str, redis_url: str, queue_name: str) -> None:
    hold = 3 * LEASE_MS / 1000
    async with User(kind, redis_url, queue_name, hold=hold) as user, rival(redis_url, queue_name) as other:
        [job] = await add(redis_url, queue_name)
        await wait_until(lambda: user.seen == [job], 20, what="the job handed to the user")
        until = time.monotonic() + hold - 0.3
        while time.monotonic() < until:  # the rival's recovery never finds it idle for a lease
            assert await other.claim_idle(LEASE_MS, 10) == []
            await asyncio.sleep(0.1)
        await wait_until(lambda: user.settled == [job], 20, what="the slow job settled")
        await wait_until(lambda: _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 0, 10)
    assert user.seen == [job]


@pytest.fixture(autouse=True)
async def _stacks_of_a_stuck_test() -> AsyncIterator[None]:
    """Print every task's stack if a scenario is still running after 60 s (before the timeout)."""

    def dump() -> None:
        for task in asyncio.all_tasks():
            task.print_stack()

    handle = asyncio.get_running_loop().call_later(60, dump)
    yield
    handle.cancel()


@pytest.mark.parametrize("kind", USERS)
async def test_a_paused_queue_hands_nothing_out(kind: str, redis_url: str, queue_name: str) -> None:
    """Pause (issue 24): jobs added to a paused queue reach neither user (the worker's handler,
    the watcher's asset events) until the resume, and none is lost or reclaimed meanwhile."""
    q = Queue(queue_name, redis_url=redis_url)
    try:
        await q.pause()
        async with User(kind, redis_url, queue_name) as user:
            jobs = await add(redis_url, queue_name, 3)
            await asyncio.sleep(2.5)  # an observation window of two leases: nothing may be handed out
            assert user.seen == []
            await q.resume()
            await wait_until(lambda: sorted(user.settled) == sorted(jobs), 20, what="the jobs after the resume")
        assert sorted(user.seen) == sorted(jobs)  # each once: held, never reclaimed
    finally:
        await q.close()
