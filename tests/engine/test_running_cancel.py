"""Cancellation (issue 25, ``core/running.py``): ``Queue.cancel(job_id)`` ends a waiting, a
delayed or a running job ``cancelled`` within 2 s: never retried, never dead-lettered, a
``cancelled`` event, and its waiters see it fail with reason ``cancelled``.

Real servers, in-process workers, and worker *processes* (``fault_support.py worker``) on
Redis 7.0 and Valkey 8.1.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import redis
from engine_support import events_of, running, wait_until, wait_until_sync
from fault_support import read_records, spawn_worker

from airflow_provider_chasqui import ConfigError, JobFailed, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.running import parse_cancels

pytestmark = pytest.mark.timeout(120)


async def _ended_cancelled(q, job_id: str, within: float = 2.0) -> float:
    t0 = time.monotonic()
    await wait_until(lambda: _is_cancelled(q, job_id), within + 10, what=f"job {job_id} to end cancelled")
    return time.monotonic() - t0


async def _completed(q, job_id: str) -> bool:
    return await q.get_job_state(job_id) == "completed"


async def _is_cancelled(q, job_id: str) -> bool:
    return await q.get_job_state(job_id) == "cancelled"


async def test_cancel_a_waiting_a_delayed_and_a_running_job(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """One worker at concurrency 1 runs a 60 s async job; behind it waits a read-ahead job; a
    delayed job (no id) and one with a caller id wait an hour.  Each cancel ends its job
    ``cancelled`` within 2 s; nothing of them ran again, was retried or dead-lettered."""
    q = queues(queue_name, redis_url)
    ran: list[str] = []
    cancelled_inside = asyncio.Event()

    async def h(job):
        ran.append(job.data)
        if job.data == "long":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled_inside.set()
                raise
        return job.data

    async with running(worker_factory(queue_name, h, redis_url, concurrency=1, store_results=True)):
        long = await q.add("x", "long", attempts=5)
        await wait_until(lambda: ran == ["long"], 30, what="the long job to start")
        behind = await q.add("x", "behind")
        delayed = await q.add("x", "delayed", delay_ms=3_600_000)
        with_id = await q.add("x", "with-id", delay_ms=3_600_000, job_id=f"{queue_name}-later")
        assert await q.cancel(delayed.id) == "cancelled"
        assert await q.cancel(with_id.id) == "cancelled"
        assert await q.cancel(behind.id) == "requested"
        assert await q.cancel(long.id) == "requested"
        assert await _ended_cancelled(q, long.id) < 2.0
        assert cancelled_inside.is_set()
        assert await _ended_cancelled(q, behind.id) < 2.0
        with pytest.raises(JobFailed, match="cancelled"):
            await long.wait_for_result(timeout=10)
        after = await q.add("x", "after")  # the slot goes on
        assert await after.wait_for_result(timeout=30) == "after"
        assert await q.cancel(after.id) == "completed"
        assert await q.cancel(long.id) == "cancelled"  # a second cancel: already ended
    assert ran == ["long", "after"]
    r = clients(redis_url)
    keys = QueueKeys.for_queue(queue_name)
    assert await r.zcard(keys.delayed) == 0 and await r.xlen(keys.dlq) == 0
    assert await r.xlen(keys.stream) == 0
    events = await events_of(r, queue_name)
    ids = {long.id, behind.id, delayed.id, with_id.id}
    assert sorted(e["id"] for e in events if e["e"] == "cancelled") == sorted(ids)
    assert not [e for e in events if e.get("id") in ids and e["e"] in ("failed", "retry-scheduled", "dlq")]
    assert await r.hlen(keys.cancel_requests) == 0


async def test_a_cancelled_thread_handler_frees_its_slot(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A plain handler cannot be stopped in its thread: its job ends cancelled at once, the
    worker's only slot runs the next job, and the thread's late result is dropped."""
    q = queues(queue_name, redis_url)
    release, started = threading.Event(), threading.Event()

    def blocking(job):
        if job.data == "block":
            started.set()
            release.wait(30)
        return job.data

    async with running(worker_factory(queue_name, blocking, redis_url, concurrency=1, store_results=True)):
        stuck = await q.add("b", "block")
        await wait_until(started.is_set, 30, what="the blocking job to start")
        assert await q.cancel(stuck.id) == "requested"
        assert await _ended_cancelled(q, stuck.id) < 2.0
        after = await q.add("b", "after")
        assert await after.wait_for_result(timeout=30) == "after"
        release.set()
        await asyncio.sleep(0.3)
        assert await q.get_job_state(stuck.id) == "cancelled"  # the thread's return wrote nothing


async def test_cancel_a_prioritized_and_a_grouped_job_before_they_run(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """Jobs waiting beside the stream (a priority, a group) are cancelled when a worker moves
    them in: they never run."""
    q = queues(queue_name, redis_url)
    ran: list[str] = []
    urgent = await q.add("x", "prio", priority=2)
    tenant = await q.add("x", "group", group="t1")
    assert await q.cancel(urgent.id) == "requested"
    assert await q.cancel(tenant.id) == "requested"

    async def h(job):
        ran.append(job.data)

    async with running(worker_factory(queue_name, h, redis_url)):
        await _ended_cancelled(q, urgent.id)
        await _ended_cancelled(q, tenant.id)
        other = await q.add("x", "other", group="t1", attempts=1)
        await wait_until(lambda: "other" in ran, 30, what="the group's next job")
    assert ran == ["other"] and other.id


@pytest.mark.parametrize("bad", ["", None, 5, "x" * 1025, b"id"])
def test_a_bad_job_id_is_a_config_error(bad: object, shared_redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=shared_redis_url) as q, pytest.raises(ConfigError, match="job_id"):
        q.cancel(bad)  # type: ignore[arg-type]


def test_parse_cancels_reads_only_live_requests() -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    reply = [b"9999999999999", b"1", None, b"-5", b"abc", b"\xff"]
    assert parse_cancels(ids, reply, now=1000) == {"a"}
    assert parse_cancels(ids, "WRONGTYPE", now=1000) == set()
    assert parse_cancels(ids, None, now=1000) == set()


@pytest.mark.single_node("writes hostile values with a plain client")
@pytest.mark.parametrize("hostile", ["junk-values", "wrong-type", "events-wrong-type"])
async def test_hostile_cancel_state_never_stalls_a_worker(
    redis_url: str, queue_name: str, queues, worker_factory, hostile: str
) -> None:
    """Junk in the request hash (or another key type there, or under the events key): the
    jobs run to their end, or a real request still cancels its job; nothing crashes."""
    keys = QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        jobs = [await q.add("h", i) for i in range(4)]
        await admin.hset(keys.controls, "cancels", b"\x00")
        if hostile == "junk-values":
            await admin.hset(keys.cancel_requests, mapping={j.id: v for j, v in zip(jobs, [b"x", b"-1", b"0", b""])})
        elif hostile == "wrong-type":
            await admin.rpush(keys.cancel_requests, jobs[0].id)
        else:
            await admin.set(keys.events, b"not a stream")
            doomed = await q.add("h", 99, delay_ms=3_600_000)
            assert await q.cancel(doomed.id) == "cancelled"  # the events are skipped, the job still ends
            assert await q.get_job_state(doomed.id) == "cancelled"

        async with running(worker_factory(queue_name, lambda job: job.data, redis_url, store_results=True)):
            for j in jobs:  # by the stored results: the events key is hostile in one case
                await wait_until(lambda j=j: _completed(q, j.id), 30, what=f"job {j.data} to complete")
    finally:
        await admin.aclose()


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.timeout(180)
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_worker_process_ends_a_running_job_cancelled(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Two worker processes (concurrency 4) run four 60 s async jobs; cancelling each running one ends it
    ``cancelled`` within 2 s, and neither worker runs it again nor retries it."""
    url = matrix_url.url
    workers = [
        spawn_worker(
            url,
            queue_name,
            tmp_path / f"c{k}.rec",
            f"cancel-{k}",
            concurrency=4,
            read_count=1,
            handler_sleep_ms=60_000,
            starts=tmp_path / f"c{k}.starts",
        )
        for k in range(2)
    ]
    try:
        with SyncQueue(queue_name, redis_url=url) as q:
            jobs = [q.add("c", {"i": i}, attempts=3) for i in range(4)]
            starts = [tmp_path / f"c{k}.starts" for k in range(2)]
            wait_until_sync(
                lambda: sum(len(p.read_text().splitlines()) for p in starts if p.exists()) == 4,
                60,
                what="all four jobs to start",
            )
            for job in jobs:
                assert q.cancel(job.id) == "requested"
            t0 = time.monotonic()
            for job in jobs:
                wait_until_sync(lambda j=job: q.get_job_state(j.id) == "cancelled", 30, what="the job to end")
            assert time.monotonic() - t0 < 2.0 + 0.5
            time.sleep(1.0)
            rows = [line.split() for p in starts for line in p.read_text().splitlines()]
            assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3], rows  # each started once
            assert read_records([tmp_path / f"c{k}.rec" for k in range(2)]).counts == {}
            assert q.peek_dlq(10) == []
    finally:
        for w in workers:
            w.stop()


@pytest.mark.single_node("writes lapsed requests with a plain client")
async def test_a_cancel_prunes_lapsed_requests(redis_url: str, queue_name: str, queues) -> None:
    """Requests no worker met (a wrong id) lapse after a week; later cancels remove them."""
    keys = QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        await admin.hset(keys.cancel_requests, mapping={"ghost-1": b"1", "ghost-2": b"junk", "live": b"99999999999999"})
        assert await q.cancel("new-one") == "requested"
        assert sorted(await admin.hkeys(keys.cancel_requests)) == [b"live", b"new-one"]
    finally:
        await admin.aclose()
