"""Leases, total failure routing, supervised tasks and consumer clean-up (issue #12).

- A job running far longer than ``claim_min_idle_ms`` runs once: its worker renews the lease
  (XCLAIM JUSTID) so the other workers' recovery never takes it.
- Whatever raises while a failure is routed (a NaN/inf backoff multiplier, a handler's own
  ``CancelledError``, a result msgpack cannot encode) settles the entry and never ends a slot.
- A reader that fails for good is restarted and ``health()`` says so; later jobs still run.
- Consumers leave the group: a worker's own at a clean stop, idle empty ones via the janitor.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import msgpack
import pytest
from engine_support import events_of, kv, pending_count, running, wait_until
from redis.exceptions import ResponseError

from airflow_provider_chasqui import Job
from airflow_provider_chasqui.core.codec import BackoffWire, Envelope, RetryOverride, encode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.running import BATCH_ATTR


async def _xlen_is(r, key: str, n: int) -> bool:
    return await r.xlen(key) == n


def _reason(entry) -> str:
    return dict(kv(entry[1]))["reason"].decode()


async def _consumers(r, stream: str) -> set[str]:
    return {c["name"].decode() for c in await r.xinfo_consumers(stream, "default")}


async def _settled(r, queue: str) -> bool:
    return await r.xlen(QueueKeys.for_queue(queue).stream) == 0 and await pending_count(r, queue) == 0


@pytest.mark.timeout(60)
async def test_a_long_job_runs_once_across_three_workers(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """3 workers, claim_min_idle_ms=1000, one 3.5 s job: before leases it ran 3 times, 3 at once."""
    r = clients(redis_url)
    runs, now_running, most = [], [0], [0]

    async def slow(job: Job) -> str:
        runs.append(job.id)
        now_running[0] += 1
        most[0] = max(most[0], now_running[0])
        try:
            await asyncio.sleep(3.5)
        finally:
            now_running[0] -= 1
        return "done"

    workers = [
        worker_factory(queue_name, slow, redis_url, claim_min_idle_ms=1000, concurrency=4, store_results=True)
        for _ in range(3)
    ]
    async with running(workers[0]), running(workers[1]), running(workers[2]):
        job = await queues(queue_name, redis_url).add("slow", {"n": 1})
        await wait_until(lambda: _settled(r, queue_name), 30, what="the job to be acked", interval=0.05)
        assert runs == [job.id] and most[0] == 1
        assert all(w.health()["ok"] is True for w in workers), [w.health() for w in workers]
    completed = [e for e in await events_of(r, queue_name) if e["e"] == "completed"]
    assert [e["id"] for e in completed] == [job.id]


def _hostile_envelope(multiplier: float, delay_ms: int) -> bytes:
    """Decodes (today), but its second retry's backoff is NaN (NaN ** 1, 0 * inf)."""
    backoff = BackoffWire("exponential", delay_ms, None, multiplier, None)
    return encode_envelope(
        Envelope(f"hostile-{multiplier}-{delay_ms}", msgpack.packb({}), 1, 1, RetryOverride(5, backoff))
    )


@pytest.mark.timeout(60)
async def test_failure_routing_never_ends_a_slot(redis_url, queue_name, clients, queues, worker_factory) -> None:
    """Four hostile retry overrides and a stray CancelledError on concurrency=4: before, 0 of
    20 later jobs ran; now every hostile entry is dead-lettered and all 20 run."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    done: list[int] = []

    async def fail(job: Job) -> None:
        raise ValueError("handler failed")

    async def stray(job: Job) -> None:
        raise asyncio.CancelledError("not ours")

    async def ok(job: Job) -> None:
        done.append(job.data["i"])

    w = worker_factory(
        queue_name, {"bad": fail, "stray": stray, "ok": ok}, redis_url, concurrency=4, delayed_enabled=False
    )
    q = queues(queue_name, redis_url)
    async with running(w):
        for mult, delay in ((math.nan, 100), (math.nan, 0), (math.inf, 0), (-math.inf, 0)):
            await r.xadd(k.stream, {"d": _hostile_envelope(mult, delay), "n": "bad"})
        await q.add("stray", {}, attempts=1)
        await wait_until(lambda: _settled(r, queue_name), 20, what="the hostile entries to be settled")
        await q.add_bulk([{"name": "ok", "data": {"i": i}} for i in range(20)])
        await wait_until(lambda: len(done) == 20, 20, what="the 20 later jobs")
        assert w.is_running and w.health()["ok"] is True, w.health()
    reasons = sorted(_reason(e) for e in await r.xrange(k.dlq))
    assert len(reasons) == 5
    assert sorted(done) == list(range(20))
    # the stray CancelledError was an ordinary failure of a one-attempt job
    assert reasons.count("retries_exhausted") == 1
    # the hostile overrides: routing_failed here, or decode_failed once the decoder refuses them
    assert all(reason in ("routing_failed", "decode_failed") for reason in reasons if reason != "retries_exhausted")
    assert await _settled(r, queue_name)


@pytest.mark.timeout(60)
async def test_an_unencodable_result_never_reruns_the_handler(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """The handler ran (its side effects happened): the job is dead-lettered as unrecoverable."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    runs: list[int] = []

    async def handler(job: Job) -> object:
        runs.append(job.attempt)
        return object()

    w = worker_factory(queue_name, handler, redis_url, store_results=True, max_attempts=5)
    async with running(w):
        job = await queues(queue_name, redis_url).add("obj", {})
        await wait_until(lambda: r.xlen(k.dlq), 20, what="the job to be dead-lettered")
        await wait_until(lambda: _settled(r, queue_name), 20, what="the entry to be acked")
    assert runs == [0]
    (entry,) = await r.xrange(k.dlq)
    assert _reason(entry) == "unrecoverable"
    failed = [e for e in await events_of(r, queue_name) if e["e"] == "failed"]
    assert [e["id"] for e in failed] == [job.id] and "cannot be stored" in failed[0]["reason"]
    assert await r.zcard(k.delayed) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch", [0, 10], ids=["one_job", "batch_handler"])
async def test_a_result_past_max_result_bytes_fails_its_job_alone_and_never_reruns(
    batch, redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """A result packing past ``max_result_bytes`` made the ack carrying it fail (Redis refuses
    an argument past ``proto-max-bulk-len``, or runs out of memory): the entry stayed pending
    and ran again, with every job of its ack batch, until its attempts ran out.  Now that job
    alone is dead-lettered ``unrecoverable`` naming the limit, after one run; a result packing
    to exactly the limit is stored, and the other jobs complete once."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    limit = 70_000
    exact = b"x" * (limit - len(msgpack.packb(b"x" * limit)) + limit)  # packs to exactly `limit`
    assert len(msgpack.packb(exact)) == limit
    runs: dict[int, int] = {}

    def one(job: Job) -> object:
        runs[job.data] = runs.get(job.data, 0) + 1
        return {0: exact + b"!", 1: exact}.get(job.data, job.data)

    async def handler(job: Job | list[Job]) -> object:
        return [one(j) for j in job] if isinstance(job, list) else one(job)

    if batch:
        setattr(handler, BATCH_ATTR, batch)
    q = queues(queue_name, redis_url)
    jobs = await q.add_bulk([{"name": "r", "data": i, "attempts": 5} for i in range(20)])
    w = worker_factory(queue_name, handler, redis_url, store_results=True, max_result_bytes=limit)
    async with running(w):
        await wait_until(lambda: r.xlen(k.dlq), 20, what="the big result's job to be dead-lettered")
        await wait_until(lambda: _settled(r, queue_name), 20, what="every entry acked")
    assert runs == dict.fromkeys(range(20), 1), runs
    (entry,) = await r.xrange(k.dlq)
    assert _reason(entry) == "unrecoverable"
    failure = await q.get_failure(jobs[0].id)
    assert f"packs to {limit + 1:,} bytes; the limit is max_result_bytes={limit:,}" in failure.error
    assert await q.get_job_result(jobs[1].id) == exact
    assert [await q.get_job_result(j.id) for j in jobs[2:]] == list(range(2, 20))


def _noting(into: list[int]) -> Callable[[Job], Awaitable[None]]:
    """A handler that notes each job's ``data["i"]``."""

    async def note(job: Job) -> None:
        into.append(job.data["i"])

    return note


@pytest.mark.timeout(60)
async def test_a_spoiled_events_key_never_makes_the_promoter_repeat_a_job(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """The events key holds another type: the promoter used to write the first due job to the
    stream, fail on its `waiting` event before removing it from the delayed set, and write it
    again at every tick (every 20 ms here).  Now the events are skipped: each of 10 delayed
    jobs runs once, and the key is left as it was."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    runs: list[int] = []
    count = _noting(runs)
    await r.set(k.events, "not a stream")
    await queues(queue_name, redis_url).add_bulk(
        [{"name": "later", "data": {"i": i}, "delay_ms": 200} for i in range(10)]
    )
    w = worker_factory(queue_name, count, redis_url, concurrency=4, promoter_poll_ms=20)
    async with running(w):
        await wait_until(lambda: len(runs) >= 10, 20, what="the delayed jobs")
        await asyncio.sleep(0.5)  # 25 more promoter ticks: a repeated job would run again meanwhile
    assert sorted(runs) == list(range(10)), runs
    assert await r.zcard(k.delayed) == 0 and await r.get(k.events) == b"not a stream"


@pytest.mark.timeout(90)
async def test_a_spoiled_delayed_set_still_bounds_a_failing_job_by_its_attempts(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """The delayed set holds another type, so no retry can be written: ``fail_batch`` refuses
    the call before acking and the entry stays pending.  Each reclaim counts a delivery, and
    the arrival gate counts deliveries as attempts: the job runs ``max_attempts`` times, never
    two at once, then is dead-lettered as ``retries_exhausted`` (no retry key needed), and the
    spoiled key is left as it was."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    runs: list[int] = []
    busy: list[int] = []

    async def fail(job: Job) -> None:
        busy.append(1)
        assert len(busy) == 1, "two runs at once"
        runs.append(job.attempt)
        await asyncio.sleep(0.05)
        busy.pop()
        raise ValueError("always fails")

    await r.set(k.delayed, "not a zset")
    w = worker_factory(queue_name, fail, redis_url, max_attempts=3, claim_min_idle_ms=300)
    async with running(w):
        await queues(queue_name, redis_url).add("doomed", {})
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), 40, what="the job to be dead-lettered")
        await wait_until(lambda: _settled(r, queue_name), 20, what="the entry to be acked")
    assert len(runs) == 3, runs
    (entry,) = await r.xrange(k.dlq)
    assert _reason(entry) == "retries_exhausted"
    assert await r.get(k.delayed) == b"not a zset"


@pytest.mark.timeout(60)
async def test_a_failing_reader_is_restarted_and_reported(
    redis_url, queue_name, clients, queues, worker_factory, caplog
) -> None:
    """The DLQ key has the wrong type, so dead-lettering a malformed arrival fails for good:
    before, the reader died and the worker stalled (and fail_batch had already acked and
    deleted the entry); now the script refuses before any write, so the entry stays pending,
    the reader is restarted with its traceback logged, later jobs run, health() reports the
    restart, and once the key is repaired the entry reaches the DLQ."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    done: list[int] = []
    ok = _noting(done)
    await r.set(k.dlq, "not a stream")
    w = worker_factory(queue_name, ok, redis_url, concurrency=4, claim_min_idle_ms=1000)
    async with running(w):
        eid = await r.xadd(k.stream, {"x": "no payload"})

        async def held() -> bool:
            try:
                return (await r.xpending(k.stream, "default"))["pending"] == 1
            except ResponseError:  # NOGROUP: the worker has not created its group yet
                return False

        await wait_until(held, 10, what="the worker to take the malformed entry")
        await queues(queue_name, redis_url).add_bulk([{"name": "ok", "data": {"i": i}} for i in range(20)])
        await wait_until(lambda: len(done) == 20, 20, what="the later jobs")
        health = await wait_until(lambda: (h := w.health())["ok"] and h, 10, what="health to recover")
        assert health["reader"].startswith("restarted 1 times; last error: WrongTypeError")  # the driver's typed error
        assert "WRONGTYPE" in health["reader"]
        assert health["flusher"] is True and health["slots"] is True and health["lease"] is True
        assert await r.xrange(k.stream, eid, eid), "the malformed entry was lost"
        await r.delete(k.dlq)  # repaired: the next recovery pass dead-letters it

        async def dead_lettered() -> bool:
            return await r.exists(k.dlq) and await r.xlen(k.dlq) == 1 and await _xlen_is(r, k.stream, 0)

        await wait_until(dead_lettered, 20, what="the entry to reach the repaired DLQ")
    assert any(rec.exc_info and "reader task failed" in rec.getMessage() for rec in caplog.records)


@pytest.mark.timeout(60)
async def test_consumers_leave_the_group(redis_url, queue_name, clients, queues, worker_factory) -> None:
    """A clean stop removes the worker's own consumer; the janitor removes idle consumers with
    nothing pending (after recovery took their entries), never one that still holds entries."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    done: list[str] = []

    async def ok(job: Job) -> None:
        done.append(job.id)

    await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    await r.xgroup_createconsumer(k.stream, "default", "ghost-idle")
    job = await q.add("held", {})
    await r.xreadgroup("default", "ghost-holder", {k.stream: ">"}, count=1)  # dies holding the job
    w = worker_factory(queue_name, ok, redis_url, claim_min_idle_ms=200, read_block_ms=200)
    async with running(w):
        await wait_until(lambda: done == [job.id], 10, what="the held job to be reclaimed and run")
        await wait_until(lambda: _only_worker(r, k.stream, w), 15, what="the janitor to remove both ghosts")
    assert await _consumers(r, k.stream) == set()


async def _only_worker(r, stream: str, w) -> bool:
    return await _consumers(r, stream) == {w.consumer_id}
