"""The asyncio Worker against the shared Redis: retries, unrecoverable errors, handlers in
threads, real parallelism, max_jobs / idle_exit_secs and the drain on close()."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import msgpack
import pytest
from engine_support import events_of, kv, pending_count, running, wait_until

from airflow_provider_chasqui import BackoffSpec, Job, Promoter, UnrecoverableError
from airflow_provider_chasqui.core.codec import Envelope, decode_envelope, encode_envelope, encode_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver


async def _xlen_is(r, key, n) -> bool:
    return await r.xlen(key) == n


async def _count_events(r, queue, kind) -> int:
    return sum(e["e"] == kind for e in await events_of(r, queue))


# ---- retries ------------------------------------------------------------------------------------


async def test_retry_member_waits_in_the_delayed_set_with_its_name(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """Without a promoter the rescheduled job stays put: the member is V8-shaped and keeps the name."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    runs: list[int] = []

    async def handler(job: Job) -> str:
        runs.append(job.attempt)
        if job.attempt == 0:
            raise ValueError("boom")
        return "ok"

    job = await q.add("send-email", {"to": "ada"}, attempts=3, backoff=BackoffSpec.fixed(250, jitter_ms=0))
    w = worker_factory(queue_name, handler, redis_url, delayed_enabled=False)
    async with running(w):
        before = int(time.time() * 1000)
        ((member, score),) = await wait_until(
            lambda: r.zrange(k.delayed, 0, -1, withscores=True), what="the retry member"
        )
        after = int(time.time() * 1000)
    retry = decode_envelope(split_env(member)).retry
    expected_env = Envelope(job.id, msgpack.packb({"to": "ada"}), job.created_at_ms, 1, retry)
    assert member == encode_member(b"send-email", encode_envelope(expected_env))
    assert retry.max_attempts == 3 and retry.backoff.delay_ms == 250
    assert before - 1000 + 250 <= score <= after + 250
    assert await r.xlen(k.stream) == 0 and await pending_count(r, queue_name) == 0
    assert runs == [0]
    # a standalone promoter moves it back; the second run succeeds as run 2
    driver = AsyncDriver(redis_url)
    promoter = Promoter(driver, queue_name, poll_interval_ms=20)
    ptask = asyncio.create_task(promoter.run())
    try:
        await wait_until(lambda: _xlen_is(r, k.stream, 1), what="promotion")
    finally:
        promoter.stop()
        await asyncio.wait_for(ptask, 10)
        await driver.close()
    assert await r.exists(k.promoter_lock) == 0  # released on a clean stop
    w2 = worker_factory(queue_name, handler, redis_url, delayed_enabled=False)
    async with running(w2):
        await wait_until(lambda: _count_events(r, queue_name, "completed"), what="second run")
    assert runs == [0, 1]
    (completed,) = [e for e in await events_of(r, queue_name) if e["e"] == "completed"]
    assert (completed["n"], completed["attempt"]) == ("send-email", "2")


def split_env(member: bytes) -> bytes:
    n = int.from_bytes(member[:4], "little")
    return member[4 + n :]


class MyFatal(UnrecoverableError):
    pass


class UnrecoverableErrorLookalike(Exception):
    """Same name, unrelated class: not unrecoverable (the check is by class, not by name)."""


UnrecoverableErrorLookalike.__name__ = "UnrecoverableError"


@pytest.mark.parametrize(
    ("exc", "dead_after", "reason"),
    [
        (UnrecoverableError("stop"), 1, "unrecoverable"),
        (MyFatal("stop"), 1, "unrecoverable"),
        (UnrecoverableErrorLookalike("stop"), 2, "retries_exhausted"),
    ],
    ids=["UnrecoverableError", "subclass", "same-name-other-class"],
)
async def test_unrecoverable_errors_skip_the_remaining_attempts(
    redis_url, queue_name, clients, queues, worker_factory, exc, dead_after, reason
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    runs: list[int] = []

    async def handler(job: Job) -> None:
        runs.append(job.attempt)
        raise exc

    job = await q.add("fatal", {"x": 1}, attempts=2, backoff=BackoffSpec.fixed(1, jitter_ms=0))
    original = dict(kv((await r.xrange(k.stream))[0][1]))["d"]
    w = worker_factory(queue_name, handler, redis_url, promoter_poll_ms=20)
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="dead letter")
    assert runs == list(range(dead_after))
    ((_id, fields),) = await r.xrange(k.dlq)
    f = dict(kv(fields))
    assert f["reason"] == reason.encode() and f["n"] == b"fatal"
    if dead_after == 1:
        assert f["d"] == original  # attempt not bumped
    evs = [e for e in await events_of(r, queue_name) if e["id"] == job.id]
    assert evs[-2]["e"] == "failed" and evs[-2]["reason"] == f"handler: Python handler raised: {exc!r}"
    assert evs[-1] == {
        "e": "dlq",
        "id": job.id,
        "ts": evs[-1]["ts"],
        "n": "fatal",
        "attempt": str(dead_after),
        "reason": reason,
    }


async def test_unknown_job_name_with_a_handler_table_is_unrecoverable(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    done: list[str] = []

    async def known(job: Job) -> None:
        done.append(job.name)

    lost = await q.add("unknown", {}, attempts=3)  # not retried: the lookup's error is unrecoverable
    await q.add("known", {})
    w = worker_factory(queue_name, {"known": known}, redis_url, store_results=True)
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="dead letter")
        await wait_until(lambda: done == ["known"], what="the known job")
    ((_id, fields),) = await r.xrange(k.dlq)
    dead = dict(kv(fields))
    assert dead["reason"] == b"unrecoverable"
    # the error recorded is the lookup's HandlerNotFound (an UnrecoverableError and a LookupError)
    error = """handler: Python handler raised: HandlerNotFound("no handler registered for job name 'unknown'")"""
    evs = [e for e in await events_of(r, queue_name) if e["id"] == lost.id]
    assert [(e["e"], e.get("reason")) for e in evs[-2:]] == [("failed", error), ("dlq", "unrecoverable")]
    assert evs[-1]["attempt"] == "1"
    failure = await q.get_failure(lost.id)
    assert failure is not None and (failure.reason, failure.error) == ("unrecoverable", error)
    assert (
        failure.traceback.rstrip().endswith("HandlerNotFound: no handler registered for job name 'unknown'")
        and failure.traceback.rstrip() == dead["detail"].decode().rstrip()
    )


async def test_tuple_keyed_data_and_results_come_back_as_sent(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """A tuple key packs to a msgpack array, which Python decoded as an unhashable list: the job
    was dead-lettered as undecodable, and a result holding one was stored but could not be read
    (``CodecError`` from ``wait_for_result``). Both now decode with tuple keys."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    seen: list[object] = []

    async def pairs(job: Job) -> dict:
        seen.append(job.data)
        return {(job.data["n"], "x"): [1, 2]}

    job = await q.add("pairs", {"n": 1, (2, (3, 4)): "nested"})
    async with running(worker_factory(queue_name, pairs, redis_url, store_results=True)):
        result = await q.wait_for_result(job.id, timeout=30)
    assert seen == [{"n": 1, (2, (3, 4)): "nested"}]
    assert result == {(1, "x"): [1, 2]}
    assert await r.xlen(k.dlq) == 0


async def test_worker_wide_max_attempts_zero_dead_letters_without_running(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    ran = []
    await q.add("never", {})
    w = worker_factory(queue_name, lambda job: ran.append(job), redis_url, max_attempts=0)
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="dead letter")
    assert ran == []
    (ev,) = [e for e in await events_of(r, queue_name) if e["e"] == "dlq"]
    assert (ev["reason"], ev["attempt"]) == ("retries_exhausted", "0")


# ---- handlers: threads and parallelism -----------------------------------------------------------


async def test_sync_handlers_run_in_worker_threads(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    threads: list[str] = []
    loop_thread = threading.current_thread().name

    def handler(job: Job) -> int:
        threads.append(threading.current_thread().name)
        if job.data == "fail":
            raise ValueError("boom")
        return job.data * 2

    await q.add("t", 21)
    await q.add("t", "fail", attempts=1)
    w = worker_factory(queue_name, handler, redis_url, store_results=True)
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="the failing sync job")
        await wait_until(lambda: _count_events(r, queue_name, "completed"), what="the good sync job")
    assert len(threads) == 2 and loop_thread not in threads
    assert all(t.startswith(f"chasqui-{queue_name}") for t in threads)


@pytest.mark.parametrize("timeout_ms", [None, 60_000], ids=["no-timeout", "with-timeout"])
async def test_exceptions_no_future_carries_fail_their_jobs_and_the_slots_run_on(
    redis_url, queue_name, queues, worker_factory, timeout_ms
) -> None:
    """A plain handler's ``StopIteration`` (``next()`` on an exhausted iterator) could not come
    back from its thread through the asyncio future: the slot waited forever, the job was never
    settled and its lease was renewed for good (or, with a timeout, it failed as a timeout and
    ran again).  A plain handler's ``GeneratorExit``, thrown into the waiting slot, ended the
    slot.  Each now fails its own job at once; async handlers as before."""
    q = queues(queue_name, redis_url)

    def plain(job: Job) -> None:
        if job.data == "stop":
            next(iter(()))
        raise GeneratorExit

    async def coro(job: Job) -> None:
        raise StopIteration

    bad = [await q.add(n, d, attempts=1, timeout_ms=timeout_ms) for n, d in (("p", "stop"), ("p", "exit"), ("a", 0))]
    good = [await q.add("ok", i) for i in range(10)]
    w = worker_factory(queue_name, {"p": plain, "a": coro, "ok": lambda job: job.data}, redis_url, store_results=True)
    async with running(w):
        outcomes = await q.wait_for_results([j.id for j in bad + good], timeout=20)
        assert len(outcomes) == 13, outcomes
        health = w.health()
    reasons = [(await q.get_failure(j.id)).error for j in bad]  # type: ignore[union-attr]
    coroutine_stop = "handler: Python handler raised: RuntimeError('coroutine raised StopIteration')"
    assert reasons == [coroutine_stop, "handler: Python handler raised: GeneratorExit()", coroutine_stop]
    assert [outcomes[j.id].state for j in bad] == ["failed"] * 3
    assert [outcomes[j.id].value for j in good] == list(range(10))
    assert health["slots"] is True and health["ok"] is True, health  # never restarted


async def test_async_handlers_really_run_concurrently(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    n = 6
    barrier = asyncio.Barrier(n)
    passed: list[int] = []

    async def handler(job: Job) -> None:
        await asyncio.wait_for(barrier.wait(), 20)  # only returns once all n run at the same time
        passed.append(job.data)

    await q.add_bulk([{"name": "p", "data": i} for i in range(n)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=n)
    async with running(w):
        await wait_until(lambda: len(passed) == n, timeout=30, what="all handlers past the barrier")


async def test_sync_handlers_really_run_in_parallel(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    n = 4
    barrier = threading.Barrier(n, timeout=20)
    passed: list[int] = []

    def handler(job: Job) -> None:
        barrier.wait()  # raises BrokenBarrierError unless n threads wait together
        passed.append(job.data)

    await q.add_bulk([{"name": "p", "data": i} for i in range(n)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=n)
    async with running(w):
        await wait_until(lambda: len(passed) == n, timeout=30, what="all threads past the barrier")


async def test_concurrency_is_a_hard_cap(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    release = asyncio.Event()
    active = 0
    peak = 0
    done = 0

    async def handler(job: Job) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        done += 1

    await q.add_bulk([{"name": "c", "data": i} for i in range(7)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=2)
    async with running(w):
        await wait_until(lambda: active == 2, what="two running handlers")
        release.set()
        await wait_until(lambda: done == 7, what="all jobs")
    assert peak == 2


async def test_a_full_ack_batch_is_written_without_waiting_out_ack_idle_ms(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """With a handler still running the flusher waits up to ``ack_idle_ms`` for more rows, but a
    batch that fills ends the wait: 10 finished jobs (``ack_batch=10``) are acked while a slow
    one runs, long before the 60 s ``ack_idle_ms``.  Sleeping it out held the finished entries
    until the reading window filled and the reader stood idle."""
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        if job.data == "slow":
            await release.wait()
        else:
            await asyncio.sleep(0.02)  # the quick ones end one by one: the first row starts the wait

    await q.add("s", "slow")
    await q.add_bulk([{"name": "f", "data": i} for i in range(10)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=2, ack_batch=10, ack_idle_ms=60_000)
    async with running(w):
        started = time.monotonic()
        await wait_until(lambda: w.processed >= 10, what="ten quick jobs", timeout=30)
        left = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = await pending_count(r, queue_name)
            if left == 1:
                break
            await asyncio.sleep(0.05)
        assert left == 1, left  # only the slow job is still pending: the full batch was acked
        assert time.monotonic() - started < 30
        release.set()
        await wait_until(lambda: w.processed == 11, what="the slow job")


# ---- lifecycle ------------------------------------------------------------------------------------


async def test_max_jobs_stops_after_exactly_that_many(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    seen: list[int] = []
    await q.add_bulk([{"name": "m", "data": i} for i in range(5)])
    w = worker_factory(queue_name, lambda job: seen.append(job.data), redis_url, concurrency=1, max_jobs=3)
    await asyncio.wait_for(w.run(), 30)  # returns by itself
    assert seen == [0, 1, 2] and w.processed == 3
    assert not w.is_running and w.is_closed
    # the other two were never delivered: nothing pending, still in the stream for the next worker
    assert await pending_count(r, queue_name) == 0
    assert await r.xlen(k.stream) == 2
    w2 = worker_factory(queue_name, lambda job: seen.append(job.data), redis_url, max_jobs=2)
    await asyncio.wait_for(w2.run(), 30)
    assert seen == [0, 1, 2, 3, 4]
    assert await r.xlen(k.stream) == 0 and await pending_count(r, queue_name) == 0


async def test_idle_exit_secs_returns_once_idle(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    seen: list[int] = []
    await q.add("i", 1)
    w = worker_factory(queue_name, lambda job: seen.append(job.data), redis_url, idle_exit_secs=0.3)
    start = time.monotonic()
    await asyncio.wait_for(w.run(), 30)
    assert seen == [1]
    assert time.monotonic() - start < 10
    empty = worker_factory(queue_name, lambda job: None, redis_url, idle_exit_secs=0.2)
    await asyncio.wait_for(empty.run(), 30)


async def test_close_drains_in_flight_and_buffered_jobs_and_flushes_acks(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    started = asyncio.Event()
    release = asyncio.Event()
    finished: list[int] = []

    async def handler(job: Job) -> None:
        started.set()
        await release.wait()
        finished.append(job.data)

    await q.add_bulk([{"name": "d", "data": i} for i in range(3)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=1)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(started.wait(), 15)
    closing = asyncio.create_task(w.close())
    await asyncio.wait_for(closing, 10)  # close() only asks; the handler is still running
    assert not task.done() and finished == []
    release.set()
    await asyncio.wait_for(task, 30)
    assert sorted(finished) == [0, 1, 2]
    assert await r.xlen(k.stream) == 0
    assert await pending_count(r, queue_name) == 0
    assert await _count_events(r, queue_name, "completed") == 3
    await q.add("after", 9)  # nobody consumes any more
    assert await r.xlen(k.stream) == 1


async def test_close_flushes_buffered_failures_as_retries_and_dead_letters(
    redis_url, queue_name, clients, queues, worker_factory, caplog
) -> None:
    """Failures raised after close() are buffered like acks and written by the final flush:
    every one ends retried (delayed set) or dead-lettered, none stays pending or is lost."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    started: list[int] = []
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        started.append(job.data)
        await release.wait()
        raise UnrecoverableError("fatal") if job.data % 2 else ValueError("again")

    jobs = await q.add_bulk([{"name": "f", "data": i} for i in range(8)])
    w = worker_factory(queue_name, handler, redis_url, concurrency=8, delayed_enabled=False)
    task = asyncio.create_task(w.run())
    await wait_until(lambda: len(started) == 8, what="all handlers running")
    await asyncio.wait_for(w.close(), 10)
    assert not task.done()
    with caplog.at_level(logging.WARNING, logger="airflow_provider_chasqui.engine.worker"):
        release.set()
        await asyncio.wait_for(task, 30)
    assert await r.xlen(k.stream) == 0 and await pending_count(r, queue_name) == 0
    members = await r.zrange(k.delayed, 0, -1)
    assert sorted(decode_envelope(split_env(m)).id for m in members) == sorted(j.id for j in jobs[0::2])
    assert all(decode_envelope(split_env(m)).attempt == 1 for m in members)
    dlq = [dict(kv(f)) for _e, f in await r.xrange(k.dlq)]
    assert sorted(f["reason"] for f in dlq) == [b"unrecoverable"] * 4
    evs = await events_of(r, queue_name)
    assert sum(e["e"] == "failed" for e in evs) == 8 and sum(e["e"] == "retry-scheduled" for e in evs) == 4
    assert sum(e["e"] == "dlq" for e in evs) == 4
    # one WARNING per failed job (within the log budget), each with its traceback
    per_job = [rec for rec in caplog.records if getattr(rec, "job_id", None)]
    assert sorted(rec.job_id for rec in per_job) == sorted(j.id for j in jobs)
    assert all("Traceback (most recent call last):" in rec.getMessage() for rec in per_job)
    assert sum("retry in" in rec.getMessage() for rec in per_job) == 4
    assert sum("dead-lettered (unrecoverable)" in rec.getMessage() for rec in per_job) == 4


async def test_close_before_run_makes_run_return(redis_url, queue_name, worker_factory) -> None:
    w = worker_factory(queue_name, lambda job: None, redis_url)
    await w.close()
    await asyncio.wait_for(w.run(), 10)
    assert not w.is_running


async def test_run_twice_waits_for_the_same_drain(redis_url, queue_name, worker_factory) -> None:
    w = worker_factory(queue_name, lambda job: None, redis_url)
    first = asyncio.create_task(w.run())
    await wait_until(lambda: w.is_running, what="running")
    second = asyncio.create_task(w.run())
    await w.close()
    await asyncio.wait_for(asyncio.gather(first, second), 20)
    await w.close()  # idempotent


async def test_close_unblocks_a_long_blocking_read(redis_url, queue_name, worker_factory) -> None:
    w = worker_factory(queue_name, lambda job: None, redis_url, read_block_ms=60_000)
    task = asyncio.create_task(w.run())
    await wait_until(lambda: getattr(getattr(w, "_intake", None), "_reader_id", None), what="reader connected")
    start = time.monotonic()
    await w.close()
    await asyncio.wait_for(task, 20)
    assert time.monotonic() - start < 10  # not the 60 s BLOCK


async def test_a_second_group_does_not_steal_but_a_second_worker_shares(
    redis_url, queue_name, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)
    a_seen: list[int] = []
    b_seen: list[int] = []

    async def a(job: Job) -> None:
        a_seen.append(job.data)
        await asyncio.sleep(0.001)

    async def b(job: Job) -> None:
        b_seen.append(job.data)
        await asyncio.sleep(0.001)

    wa = worker_factory(queue_name, a, redis_url, concurrency=2, read_count=2)
    wb = worker_factory(queue_name, b, redis_url, concurrency=2, read_count=2)
    async with running(wa), running(wb):
        await q.add_bulk([{"name": "s", "data": i} for i in range(40)])
        await wait_until(lambda: len(a_seen) + len(b_seen) == 40, what="all jobs once")
    assert sorted(a_seen + b_seen) == list(range(40))  # each exactly once across the two consumers


@pytest.mark.timeout(60)
async def test_a_failing_metrics_sink_never_costs_a_job(redis_url, queue_name, queues, worker_factory, caplog) -> None:
    """Every report goes through the guarded sink (``engine/metrics.py``): a sink that raises on
    every call, or lacks most methods, is logged, and every job still runs, is acked and counted."""

    class Broken:
        def job_completed(self, *args: object) -> None:
            raise RuntimeError("sink down")

        def batch(self, *args: object) -> None:
            raise RuntimeError("sink down")

        def job_failed(self, *args: object) -> None:
            raise RuntimeError("sink down")

    runs: list[int] = []

    async def handler(job: Job) -> None:
        runs.append(job.data["i"])
        if job.data["i"] == 0:
            raise UnrecoverableError("to the DLQ")

    q = queues(queue_name, redis_url)
    w = worker_factory(queue_name, handler, redis_url, metrics=Broken(), concurrency=4)
    async with running(w):
        await q.add_bulk([{"name": "n", "data": {"i": i}} for i in range(20)])
        await wait_until(lambda: w.processed == 20, 20, what="every job counted")
    assert sorted(runs) == list(range(20))
    assert len(await q.peek_dlq(50)) == 1
    assert any("metrics sink Broken.job_completed failed" in r.getMessage() for r in caplog.records)
