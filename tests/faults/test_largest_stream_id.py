"""A stream entry at the largest id (``18446744073709551615-18446744073709551615``, which any
writer may add with an explicit id) ends every range read that reaches it: Redis refuses an
exclusive start after it ("invalid start ID for the interval"), and the cursors of the DLQ tools,
the stream scan, the status snapshot, a restarted consumer's own backlog and the Spark reader's
pages used to ask exactly that once a page ended on it, failing the tool (or, for the consumer,
its every read)."""

from __future__ import annotations

import re

import msgpack
import pytest
import redis
from engine_support import wait_until

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.codec import Envelope, encode_envelope
from airflow_provider_chasqui.core.dlq import PAGE_WINDOW, dlq_page
from airflow_provider_chasqui.core.event_follow import LAST_STREAM_ID, after
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)

U64 = 18446744073709551615


def _fields(job_id: str, reason: str = "") -> dict[str, bytes | str]:
    env = encode_envelope(Envelope(job_id, msgpack.packb({"id": job_id}), 1700000000000, 0, None))
    return {"d": env, "n": "job", **({"reason": reason, "source_id": "1-0"} if reason else {})}


def _dlq_ending_at_the_largest_id(r: redis.Redis, k: QueueKeys, n: int) -> None:
    """``n`` entries, the last at the largest id and the one before it at the largest sequence."""
    r.delete(k.dlq)
    for i in range(n - 2):
        r.xadd(k.dlq, _fields(f"J{i}", "a" if i % 2 else "b"), id=f"1-{i + 1}")
    r.xadd(k.dlq, _fields("J-seq", "a"), id=f"5-{U64}")
    r.xadd(k.dlq, _fields("J-last", "a"), id=LAST_STREAM_ID)


def test_after_the_largest_id_nothing_follows() -> None:
    assert after("5-7") == "(5-7" and after(f"5-{U64}") == f"(5-{U64}" and after(LAST_STREAM_ID) is None


def test_dlq_tools_reach_the_largest_id_without_failing(redis_url: str, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as q:
        # a purge by reason scans PAGE_WINDOW summaries a round trip: the first window ends on it
        _dlq_ending_at_the_largest_id(r, k, PAGE_WINDOW)
        odd = sum(1 for i in range(PAGE_WINDOW - 2) if i % 2)
        assert q.purge_dlq(reason="a") == odd + 2
        assert r.xlen(k.dlq) == PAGE_WINDOW - 2 - odd
        assert q.purge_dlq() == PAGE_WINDOW - 2 - odd and r.xlen(k.dlq) == 0  # no "next id" after it
        _dlq_ending_at_the_largest_id(r, k, 5)
        assert q.purge_dlq() == 5 and r.xlen(k.dlq) == 0

        # a page that ends on it says there is no next page; a cursor at it is an empty page
        _dlq_ending_at_the_largest_id(r, k, 6)
        page = q.driver.run(dlq_page(queue_name, None, 6, None, None))
        assert [row["dlq_id"] for row in page["rows"]][-2:] == [f"5-{U64}", LAST_STREAM_ID]
        assert page["next"] is None and page["total"] == 6
        assert q.driver.run(dlq_page(queue_name, LAST_STREAM_ID, 10, None, None))["rows"] == []
        page = q.driver.run(dlq_page(queue_name, None, 5, None, None))  # ends one before it
        assert page["next"] == f"5-{U64}" and len(page["rows"]) == 5
        assert [row["dlq_id"] for row in q.driver.run(dlq_page(queue_name, page["next"], 5, None, None))["rows"]] == [
            LAST_STREAM_ID
        ]

        # a replay reads 64 entries a step inside the scan script: the first step ends on it
        _dlq_ending_at_the_largest_id(r, k, 64)
        r.delete(k.stream)
        assert q.replay_dlq(500) == 64
        assert r.xlen(k.dlq) == 0 and r.xlen(k.stream) == 64


def test_the_snapshot_and_a_restarted_consumer_pass_the_largest_id(redis_url: str, queue_name: str) -> None:
    """Both entries delivered, the last at the largest id: the snapshot's "oldest waiting" read
    starts after the group's last delivered id, and a consumer restarted under the same name
    pages through its own backlog from after the last entry of a full page."""
    import asyncio

    from engine_support import consumer_core

    from airflow_provider_chasqui.engine._driver import AsyncDriver
    from airflow_provider_chasqui.engine.intake import Intake

    k = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("job", {"i": 0})
        r.xadd(k.stream, _fields("J-last"), id=LAST_STREAM_ID)

        async def crash_then_restart() -> list[int]:
            driver = AsyncDriver(redis_url)
            try:
                first = Intake(driver, consumer_core(queue_name, consumer_id="same"), lease_ms=60_000)
                await first.open()
                assert len(await first.next_batch(2, 10)) == 2  # then "crashes": nothing settled
                again = Intake(driver, consumer_core(queue_name, consumer_id="same"), lease_ms=60_000)
                await again.open()
                # a full page of its own backlog ends on the largest id; the next reads go on
                return [len(await again.next_batch(2, 10)) for _ in range(3)]
            finally:
                await driver.close()

        assert asyncio.run(crash_then_restart()) == [2, 0, 0]
        snap = q.inspect()
        assert snap.oldest_waiting_ms is None


def test_the_spark_readers_pages_end_on_the_largest_id(redis_url: str, queue_name: str) -> None:
    pytest.importorskip("pyspark")
    from airflow_provider_chasqui.spark.datasource.reader import xrange_pages

    k = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as q:
        _dlq_ending_at_the_largest_id(r, k, 6)
        for page in (1, 2, 3, 6, 7):
            ids = [entry[0] for entry in xrange_pages(q, k.dlq, "-", "+", page)]
            assert len(ids) == 6 and ids[-1] == LAST_STREAM_ID.encode(), (page, ids)


def test_a_worker_settles_every_job_once_beside_a_full_events_stream(redis_url: str, queue_name: str) -> None:
    """An events stream whose last id is the largest refuses every event.  The worker's acks
    were written by scripts that failed at their first event: no job was ever acknowledged,
    and each ran again after every lease.  Events are best effort: the jobs settle once."""
    import asyncio
    import collections
    import time

    from airflow_provider_chasqui import Queue, Worker

    k = QueueKeys.for_queue(queue_name)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(job) -> None:
        runs[job.id] += 1
        if job.data["i"] % 7 == 3 and runs[job.id] == 1:
            raise ValueError("fails once")

    async def scenario() -> tuple[list[str], int, int]:
        async with Queue(queue_name, redis_url=redis_url) as q:
            with redis.Redis.from_url(redis_url) as r:
                r.xadd(k.events, {"junk": "x"}, id=LAST_STREAM_ID)
                ids = [(await q.add("job", {"i": i}, attempts=3, backoff=1)).id for i in range(40)]
                w = Worker(queue_name, handler, redis_url=redis_url, concurrency=8, claim_min_idle_ms=2_000)
                task = asyncio.create_task(w.run())
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    info = r.xinfo_groups(k.stream) if r.exists(k.stream) else []
                    pending = sum(g["pending"] for g in info)
                    if r.xlen(k.stream) == 0 and pending == 0 and r.zcard(k.delayed) == 0 and len(runs) == 40:
                        break
                    await asyncio.sleep(0.05)
                await w.close()
                await asyncio.wait_for(task, 30)
                return ids, r.xlen(k.stream) + r.zcard(k.delayed), r.xlen(k.events)

    ids, left, events = asyncio.run(scenario())
    assert left == 0 and sorted(runs) == sorted(ids)
    failing = {ids[i] for i in range(40) if i % 7 == 3}
    assert all(runs[j] == (2 if j in failing else 1) for j in ids), runs  # once each, twice for a retry
    assert events == 1  # the events stream took nothing


def test_a_full_stream_keeps_its_delayed_jobs_until_cleared(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A full stream: a plain add is refused with an error naming it, the promoter keeps every
    delayed job where it is (its tick refused before any write) and says so a few times, not
    at each of its ticks; once the stream is deleted the jobs run, each once."""
    import asyncio
    import collections
    import logging
    import time

    from airflow_provider_chasqui import Queue, Worker
    from airflow_provider_chasqui.errors import ChasquiError

    k = QueueKeys.for_queue(queue_name)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(job) -> None:
        runs[job.id] += 1

    async def scenario() -> list[str]:
        async with Queue(queue_name, redis_url=redis_url) as q:
            with redis.Redis.from_url(redis_url) as r:
                ids = [(await q.add("job", {"i": i}, delay_ms=1)).id for i in range(5)]
                r.xadd(k.stream, {"junk": "x"}, id=LAST_STREAM_ID)
                with pytest.raises(ChasquiError, match=re.escape(k.stream) + " is full"):
                    await q.add("job", {"i": 9})
                w = Worker(queue_name, handler, redis_url=redis_url, concurrency=4, claim_min_idle_ms=2_000)
                task = asyncio.create_task(w.run())
                try:
                    await asyncio.sleep(2.0)  # about 20 promoter ticks
                    assert r.zcard(k.delayed) == 5 and not runs
                    r.delete(k.stream)  # the way out: the group is made again on the next read
                    deadline = time.monotonic() + 30
                    while len(runs) < 5 and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                finally:
                    await w.close()
                    await asyncio.wait_for(task, 30)
                return ids

    with caplog.at_level(logging.ERROR, logger="airflow_provider_chasqui.engine.leader"):
        ids = asyncio.run(scenario())
    assert sorted(runs) == sorted(ids) and set(runs.values()) == {1}
    refused = [rec for rec in caplog.records if "is full" in rec.getMessage()]
    assert 1 <= len(refused) <= 3, [rec.getMessage() for rec in refused]


def test_a_group_cursor_past_the_streams_end_is_moved_back_by_the_workers(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two racing workers read an entry at the largest id (it is dead-lettered as malformed), so
    the group's cursor is the largest id; the operator lets the stream out of being full the
    way Redis 7.0 allows (``XSETID`` lower: Redis 8.2 and Valkey refuse it, and there a foreign
    ``XGROUP SETID`` does the same).  Every id added next is below the cursor: before, no job
    was ever read again.  An idle worker moves the cursor back within a lease: each job runs
    once."""
    import asyncio
    import collections
    import logging

    from airflow_provider_chasqui import Queue, Worker
    from airflow_provider_chasqui.core.keys import DEFAULT_GROUP

    k = QueueKeys.for_queue(queue_name)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(job) -> None:
        runs[job.id] += 1

    def cursor(r: redis.Redis) -> bytes:
        return next(g["last-delivered-id"] for g in r.xinfo_groups(k.stream) if g["name"] == DEFAULT_GROUP.encode())

    async def scenario() -> list[str]:
        async with Queue(queue_name, redis_url=redis_url) as q:
            with redis.Redis.from_url(redis_url) as r:
                workers = [
                    Worker(queue_name, handler, redis_url=redis_url, concurrency=4, claim_min_idle_ms=1_000)
                    for _ in range(2)
                ]
                tasks = [asyncio.create_task(w.run()) for w in workers]
                try:
                    ids = [(await q.add("job", {"i": i})).id for i in range(5)]
                    await wait_until(lambda: len(runs) == 5, 30)
                    r.xadd(k.stream, {"junk": "x"}, id=LAST_STREAM_ID)
                    await wait_until(lambda: r.xlen(k.dlq) == 1 and r.xlen(k.stream) == 0, 30)
                    assert cursor(r) == LAST_STREAM_ID.encode()
                    try:
                        r.execute_command("XSETID", k.stream, "1-1")  # Redis 7.0: the stream takes entries again
                    except redis.ResponseError as exc:
                        assert "max_deleted_entry_id" in str(exc), exc
                        with r.pipeline() as p:  # the stream stays full there: made anew, its cursor set ahead
                            p.delete(k.stream)
                            p.xgroup_create(k.stream, DEFAULT_GROUP, id="0", mkstream=True)
                            p.xgroup_setid(k.stream, DEFAULT_GROUP, LAST_STREAM_ID)
                            p.execute()
                    ids += [(await q.add("job", {"i": i})).id for i in range(5, 25)]
                    await wait_until(lambda: len(runs) == 25, 30)
                    assert cursor(r) != LAST_STREAM_ID.encode()
                    await wait_until(lambda: r.xlen(k.stream) == 0, 30)  # every one acked
                finally:
                    for w in workers:
                        await w.close()
                    await asyncio.wait_for(asyncio.gather(*tasks), 30)
                return ids

    with caplog.at_level(logging.WARNING, logger="airflow_provider_chasqui.engine.intake"):
        ids = asyncio.run(scenario())
    assert sorted(runs) == sorted(ids) and set(runs.values()) == {1}
    moved = [rec for rec in caplog.records if "cursor was past the stream's last id" in rec.getMessage()]
    assert 1 <= len(moved) <= 2, [rec.getMessage() for rec in moved]


def test_followers_and_waiters_carry_on_beside_a_full_events_stream(redis_url: str, queue_name: str) -> None:
    """An entry at the largest id in the events stream: no event can be written after it, and
    once the stream is deleted every new id is below the followers' positions.  Before, a
    waiter timed out on a job that completed with its result stored, and a ``QueueEvents``
    follower never read another event.  Now waiters (the async hub and the blocking wait) read
    the stored records while the stream is full, and the follower reads on once it is deleted."""
    import asyncio
    import time

    from airflow_provider_chasqui import Queue, QueueEvents, Worker

    k = QueueKeys.for_queue(queue_name)
    seen: list[tuple[str, str]] = []

    async def handler(job) -> int:
        await asyncio.sleep(0.3)  # still running when its waiter joins
        return job.data["i"] * 2

    async def follow(ev: QueueEvents) -> None:
        async for e in ev:
            seen.append((e.event_id, e.name))

    async def scenario() -> None:
        w = Worker(queue_name, handler, redis_url=redis_url, concurrency=4, store_results=True)
        ev = QueueEvents(queue_name, redis_url=redis_url, block_ms=500)
        tasks = [asyncio.create_task(w.run()), asyncio.create_task(follow(ev))]
        try:
            async with Queue(queue_name, redis_url=redis_url) as q:
                with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as sq:
                    assert await q.wait_for_result((await q.add("job", {"i": 1})).id, timeout=10) == 2
                    await wait_until(lambda: "completed" in {n for _e, n in seen}, 30)
                    r.xadd(k.events, {"e": "junk"}, id=LAST_STREAM_ID)
                    await wait_until(lambda: (LAST_STREAM_ID, "junk") in seen, 30)
                    t0 = time.monotonic()
                    assert await q.wait_for_result((await q.add("job", {"i": 2})).id, timeout=10) == 4
                    job3 = (await q.add("job", {"i": 3})).id
                    assert await asyncio.to_thread(sq.wait_for_result, job3, 10) == 6
                    assert time.monotonic() - t0 < 8  # polled each second, not waited out
                    assert seen[-1] == (LAST_STREAM_ID, "junk")  # no event could follow it
                    r.delete(k.events)  # the way out
                    job4 = (await q.add("job", {"i": 4})).id
                    assert await q.wait_for_result(job4, timeout=10) == 8
                    await wait_until(lambda: seen[-1][1] == "completed", 30)
                    assert seen[-1][0] != LAST_STREAM_ID and seen[-2][1] == "active"
        finally:
            await ev.close()
            await w.close()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    asyncio.run(scenario())
