"""Worker defaults, the shutdown deadline (nothing lost past it) and the promoter's leader lock."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_support import events_of, late_and_losing_the_cancel, pending_count, running, wait_until

from airflow_provider_chasqui import ConfigError, Job, Promoter, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver


async def _pending_is(r, queue, n) -> bool:
    return await pending_count(r, queue) == n


async def test_a_worker_with_chasquimq_defaults_runs(redis_url, queue_name, clients, queues) -> None:
    """Code written for chasquimq: ``Worker(queue, handler, redis_url=...)`` and nothing else
    (embedded promoter and cron scheduler on)."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    w = Worker(queue_name, handler, redis_url=redis_url)
    assert w.name == queue_name and not w.is_running
    async with running(w):
        await q.add("now", 1)
        await q.add("later", 2, delay=timedelta_ms(30))
        await wait_until(lambda: len(seen) == 2, what="both jobs")
        assert w.is_running
    assert sorted((j.name, j.data) for j in seen) == [("later", 2), ("now", 1)]
    assert await r.exists(k.promoter_lock, k.scheduler_lock) == 0  # both released on close


def timedelta_ms(ms: int):
    from datetime import timedelta

    return timedelta(milliseconds=ms)


async def test_past_the_shutdown_deadline_a_stuck_job_stays_pending_and_is_reclaimed(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    started = asyncio.Event()

    async def stuck(job: Job) -> None:
        started.set()
        await asyncio.Event().wait()  # never returns on its own

    await q.add("stuck", {"k": 1})
    w = worker_factory(queue_name, stuck, redis_url, shutdown_deadline_secs=0.3)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(started.wait(), 15)
    t0 = time.monotonic()
    await w.close()
    await asyncio.wait_for(task, 20)
    assert time.monotonic() - t0 < 10
    # not acknowledged, not lost: still pending on the stopped consumer
    assert await pending_count(r, queue_name) == 1 and await r.xlen(k.stream) == 1
    done: list[Job] = []

    async def healthy(job: Job) -> None:
        done.append(job)

    async with running(worker_factory(queue_name, healthy, redis_url, claim_min_idle_ms=200)):
        await wait_until(lambda: done, what="the reclaimed job")
        await wait_until(lambda: _pending_is(r, queue_name, 0), what="acked")
    assert [(j.name, j.data, j.attempt) for j in done] == [("stuck", {"k": 1}, 0)]
    assert await r.xlen(k.stream) == 0


async def test_only_one_promoter_leads_and_another_takes_over(redis_url, queue_name, clients) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    d1, d2 = AsyncDriver(redis_url), AsyncDriver(redis_url)
    a = Promoter(d1, queue_name, holder="p-a", poll_interval_ms=20)
    b = Promoter(d2, queue_name, holder="p-b", poll_interval_ms=20)
    tries = 0
    b_acquire = b._acquire

    async def counting_acquire() -> bool:
        nonlocal tries
        tries += 1
        return await b_acquire()

    b._acquire = counting_acquire  # type: ignore[method-assign]
    ta = asyncio.create_task(a.run())
    try:
        await wait_until(lambda: a.is_leader, what="a leads")
        tb = asyncio.create_task(b.run())
        try:
            await wait_until(lambda: _get(r, k.promoter_lock, b"p-a"), what="a holds the lock")
            await wait_until(lambda: tries >= 3, what="b trying to lead")
            assert a.is_leader and not b.is_leader  # b keeps asking every tick and is refused
            a.stop()
            await asyncio.wait_for(ta, 10)  # releases the lock on the way out
            await wait_until(lambda: b.is_leader, what="b takes over")
            assert await r.get(k.promoter_lock) == b"p-b"
            assert 0 < await r.ttl(k.promoter_lock) <= 5
        finally:
            b.stop()
            await asyncio.wait_for(tb, 10)
    finally:
        a.stop()
        await asyncio.gather(ta, return_exceptions=True)
        await d1.close()
        await d2.close()
    assert await r.exists(k.promoter_lock) == 0


async def _get(r, key, value) -> bool:
    return await r.get(key) == value


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"concurrency": True},
        {"max_attempts": -1},
        {"read_block_ms": 0},
        {"max_jobs": 0},
        {"no_such_option": 1},
        {"claim_min_idle_ms": -5},
    ],
    ids=["concurrency-0", "concurrency-bool", "max-attempts-neg", "block-0", "max-jobs-0", "unknown", "claim-neg"],
)
def test_bad_worker_options_fail_at_construction(kwargs) -> None:
    with pytest.raises(ConfigError):
        Worker("q", lambda job: None, redis_url="redis://127.0.0.1:1/0", **kwargs)


@pytest.mark.parametrize("handler", [None, 5, {"a": 1}], ids=["none", "int", "table-of-non-callables"])
def test_handler_must_be_callable(handler) -> None:
    with pytest.raises(ConfigError):
        Worker("q", handler, redis_url="redis://127.0.0.1:1/0")


async def test_events_disabled_writes_no_events(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    done: list[int] = []

    async def handler(job: Job) -> None:
        done.append(job.data)
        if job.data == 2:
            raise ValueError("x")

    w = worker_factory(queue_name, handler, redis_url, events_enabled=False, promoter_poll_ms=20)
    async with running(w):
        await q.add("e", 1)
        await q.add("e", 2, attempts=2, backoff=1)
        await q.add("e", 3, delay=20)
        await wait_until(lambda: len(done) == 4, what="all runs")
        await wait_until(lambda: _dlq_len(r, k, 1), what="dead letter")
    assert await events_of(r, queue_name) == []


async def _dlq_len(r, k, n) -> bool:
    return await r.xlen(k.dlq) == n


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0?cluster=true"], ids=["single", "cluster"]
)
async def test_close_while_redis_was_never_reachable_is_a_clean_stop(worker_factory, url) -> None:
    """The worker retries a missing Redis for ever; close() ends that without raising."""
    w = worker_factory("never-reachable", lambda job: None, url)
    task = asyncio.create_task(w.run())
    await wait_until(lambda: w.is_running, what="running (and retrying)")
    assert not task.done()
    await w.close()
    await asyncio.wait_for(task, 20)  # returns; no ConnectionError escapes
    assert not w.is_running and w.is_closed


async def test_the_stream_deleted_under_a_running_worker(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """NOGROUP after the stream (and its group) vanished: the worker recreates the group."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    seen: list[int] = []
    w = worker_factory(queue_name, lambda job: seen.append(job.data), redis_url, read_block_ms=100)
    async with running(w) as task:
        await q.add("a", 1)
        await wait_until(lambda: seen == [1], what="first job")
        await r.delete(k.stream)
        await q.add("a", 2)
        await wait_until(lambda: seen == [1, 2], what="a job after the stream was recreated")
        assert not task.done()
    assert await r.xlen(k.stream) == 0


@pytest.mark.timeout(90)
async def test_cancelling_run_stops_the_worker_as_close_does(redis_url, queue_name, clients, queues) -> None:
    """Cancelling the task that runs ``Worker.run()`` (``asyncio.run`` ending on an error, a
    TaskGroup, a web server's lifespan) used to leave the reader and slots running and wait out
    every deadline of the stop: 40 s for an idle worker.  Now it stops as ``close()`` does: the
    running handler finishes, its job is acked once, nothing stays pending, the heartbeat and the
    promoter lock are gone, and the task ends cancelled well before the 30 s shutdown deadline."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    runs: list[str] = []
    started = asyncio.Event()

    async def slow(job: Job) -> None:
        runs.append(job.id)
        started.set()
        await asyncio.sleep(1.0)

    w = Worker(queue_name, slow, redis_url=redis_url, shutdown_deadline_secs=30)
    task = asyncio.create_task(w.run())
    await q.add("slow", 1)
    await asyncio.wait_for(started.wait(), 30)
    begun = time.monotonic()
    task.cancel()
    await asyncio.wait([task], timeout=60)
    stop_secs = time.monotonic() - begun
    assert task.cancelled(), "run() swallowed the cancel"
    assert stop_secs < 10, f"a cancelled run() took {stop_secs:.1f} s to stop (the bug: 30 s and more)"
    assert len(runs) == 1 and await pending_count(r, queue_name) == 0 and await r.xlen(k.stream) == 0
    assert await r.exists(k.promoter_lock, k.scheduler_lock) == 0
    assert await r.zcard(k.beats) == 0

    # an idle worker, cancelled: it stops at once and runs nothing afterwards
    idle = Worker(queue_name, slow, redis_url=redis_url, shutdown_deadline_secs=30)
    task = asyncio.create_task(idle.run())
    await wait_until(lambda: idle.health().get("ok"), 30, what="the idle worker consuming")
    begun = time.monotonic()
    task.cancel()
    await asyncio.wait([task], timeout=60)
    stop_secs = time.monotonic() - begun
    assert task.cancelled() and stop_secs < 10, f"an idle worker took {stop_secs:.1f} s to stop"
    await q.add("slow", 2)
    assert await r.xlen(k.stream) == 1 and len(runs) == 1, "a cancelled worker still consumed"


@pytest.mark.timeout(90)
async def test_a_stop_whose_unblock_beat_the_read_to_the_server_ends_at_once(
    redis_url, queue_name, queues, worker_factory
) -> None:
    """The stop ends the reader's blocking read with ``CLIENT UNBLOCK`` over another connection;
    one that reaches the server before the read (answered 0) used to leave that read to run its
    whole ``read_block_ms``.  Forced here: reads reach the server 0.3 s late, and the stop lands
    while one is on its way; it must not wait out the 8 s block."""
    q = queues(queue_name, redis_url)
    seen: list[int] = []
    w = worker_factory(queue_name, lambda job: seen.append(job.data), redis_url, concurrency=1, read_block_ms=8000)
    task = asyncio.create_task(w.run())
    try:
        await q.add("a", 1)
        await wait_until(lambda: seen == [1], what="the first job")
        reader, sending = w._intake.reader, asyncio.Event()
        is_read = lambda *a: str(a[0]).upper() == "XREADGROUP"  # noqa: E731
        reader.execute_command = late_and_losing_the_cancel(reader.execute_command, is_read, sending=sending)
        await q.add("a", 2)  # ends the read in flight; the next one goes through the patch
        await asyncio.wait_for(sending.wait(), 30)
        begun = time.monotonic()
        await w.close()
        await asyncio.wait_for(task, 60)
        stop_secs = time.monotonic() - begun
        assert stop_secs < 4, f"the stop took {stop_secs:.1f} s: it waited out the read's block"
        assert seen == [1, 2]
    finally:
        await w.close()
        await asyncio.gather(task, return_exceptions=True)
