"""Queue pause and resume (issue 24): ``Queue.pause()`` stops every worker starting new jobs.

Real servers (Redis 7.0 and Valkey 8.1) and worker *processes* (``fault_support.py worker``)
that record each handler start and end.  The controls live in ``{chasqui:<queue>}:controls``
(``core/controls.py``); hostile values there read as "no control".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis
from engine_support import running, wait_until, wait_until_sync
from fault_support import WorkerGroup, read_records

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.controls import NO_CONTROLS, Controls, parse_controls
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(300)

N = 3000
LEASE_MS = 2000


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_paused_queue_starts_nothing_even_through_a_sigkill(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Three worker processes run a backlog; the queue is paused mid-run.  From a second after
    the pause (its bound is 0.1 s), no job starts: not while one worker is SIGKILLed holding
    jobs it read (the others' lease recovery takes them, and holds them too), nor for three
    leases after.  After the resume every job runs, each exactly once (none had started)."""
    url = matrix_url.url
    with SyncQueue(queue_name, redis_url=url) as q:
        for start in range(0, N, 1000):
            q.add_bulk([{"name": "p", "data": {"i": i}} for i in range(start, start + 1000)])
        group = WorkerGroup.spawn(
            url, queue_name, tmp_path, "pause", concurrency=10, handler_sleep_ms=20, claim_min_idle_ms=LEASE_MS
        )
        workers, started = group.workers, group.started

        try:
            wait_until_sync(lambda: started() >= 300, 120, what="300 jobs to start")
            assert not q.is_paused()
            q.pause()
            assert q.is_paused()
            # a worker obeys controls read at most CONTROLS_MAX_AGE_SECS (0.1 s) before a batch:
            # starts stop within that, given here a second's margin for a loaded host
            time.sleep(1)
            frozen = started()
            assert frozen < N, "the backlog ran out before the pause"
            victim = workers[0]
            victim.kill()  # holding what it read after the pause, and maybe jobs of its last batch
            time.sleep(3 * LEASE_MS / 1000)  # three leases: the others reclaim the victim's jobs, and hold them
            assert started() == frozen, f"{started() - frozen} jobs started while the queue was paused"
            assert all(w.alive() for w in workers[1:]), workers[1].log_tail()
            q.resume()
            assert not q.is_paused()
            wait_until_sync(lambda: group.ended() >= N, 180, what="every job after the resume")
        finally:
            group.stop()
        rec = read_records(group.records)
        assert sorted(rec.counts) == list(range(N)), "a job was lost"
        # the victim died with nothing running (everything in flight had ended): no job ran twice
        assert max(rec.counts.values()) == 1, {i: c for i, c in rec.counts.items() if c > 1}


async def test_a_worker_holds_what_it_read_and_renews_it(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A job added while the queue is paused is read, held (its lease renewed, so nobody else
    takes it after the lease) and run after the resume; the producer was never refused."""
    q = queues(queue_name, redis_url)
    await q.pause()
    ran: list[int] = []

    async def handler(job):
        ran.append(job.data)
        return job.data

    async with running(worker_factory(queue_name, handler, redis_url, claim_min_idle_ms=500, store_results=True)):
        jobs = await q.add_bulk([{"name": "h", "data": i} for i in range(20)])
        await asyncio.sleep(2)  # an observation window of four leases: nothing may run, nothing dead-letters
        assert ran == []
        await q.resume()
        results = await asyncio.gather(*(j.wait_for_result(timeout=60) for j in jobs))
    assert results == list(range(20)) and sorted(ran) == list(range(20))


@pytest.mark.single_node("writes the controls key with a plain client")
@pytest.mark.parametrize("hostile", ["string", "garbage", "empty-field", "list"])
async def test_hostile_controls_are_no_control(
    redis_url: str, queue_name: str, queues, worker_factory, hostile: str
) -> None:
    """Whatever sits in the controls key (another type, foreign bytes), the workers run on."""
    key = QueueKeys.for_queue(queue_name).controls
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        if hostile == "string":
            await admin.set(key, b"\xff\x00paused")
        elif hostile == "garbage":
            await admin.hset(key, mapping={"paused": b"\xff\xfe\x00{nan}", "x": b"1"})
        elif hostile == "empty-field":
            await admin.hset(key, mapping={"paused": b""})
        else:
            await admin.rpush(key, b"paused", b"1")
        q = queues(queue_name, redis_url)
        assert await q.is_paused() is False
        async with running(worker_factory(queue_name, lambda job: job.data * 2, redis_url, store_results=True)):
            job = await q.add("h", 21)
            assert await job.wait_for_result(timeout=60) == 42
    finally:
        await admin.aclose()


@pytest.mark.parametrize(
    ("reply", "paused"),
    [
        ([b"paused", b"1"], True),
        ({"paused": b"1"}, True),
        ({b"paused": "1"}, True),
        ([b"paused", b"true"], False),
        ([b"paused", b"1 "], False),
        ([b"paused"], False),  # odd length: no pair
        ([], False),
        (None, False),
        (b"1", False),
        (Exception("WRONGTYPE"), False),
        ([b"other", b"1"], False),
    ],
)
def test_parse_controls_reads_only_what_pause_writes(reply: object, paused: bool) -> None:
    assert parse_controls(reply) == Controls(paused=paused)
    assert (parse_controls(reply) == NO_CONTROLS) is not paused


async def test_paused_workers_poll_without_spinning(redis_url: str, queue_name: str, queues, worker_factory) -> None:
    """A worker holding jobs of a paused queue asks every ``PAUSE_POLL_SECS``, no faster."""
    from airflow_provider_chasqui.engine.flow_gate import PAUSE_POLL_SECS

    q = queues(queue_name, redis_url)
    await q.pause()
    worker = worker_factory(queue_name, lambda job: None, redis_url)
    async with running(worker):
        await q.add("h", 1)
        intake = await wait_until(lambda: getattr(worker, "_intake", None), what="the worker's intake")
        await wait_until(lambda: intake.flow.held, 30, what="the job to be held")
        asked = []
        real = intake.flow.read

        async def counting():
            asked.append(time.monotonic())
            return await real()

        intake.flow.read = counting
        await asyncio.sleep(2)
        intake.flow.read = real
        await q.resume()
    assert 2 / PAUSE_POLL_SECS - 3 <= len(asked) <= 2 / PAUSE_POLL_SECS + 2, len(asked)
