"""Listeners of a Worker and of QueueEvents, the worker's own pause, and waiting on a job with
``Job.wait_until_finished`` (chasquimq's listener API: ``engine/listeners.py``,
``engine/worker_events.py``): every event with its arguments, callbacks that raise or are async,
plain handlers reporting from their threads, and jobs read ahead while the worker is paused."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_support import events_of, late_and_losing_the_cancel, running, wait_until
from servers import free_port

from airflow_provider_chasqui import Job, JobFailed, QueueEvents, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)


async def test_error_listeners_hear_redis_unreachable_while_the_worker_starts(queue_name) -> None:
    """A worker pointed at a port nothing listens on retries with backoff; each failure reaches
    its ``error`` listeners (as BullMQ's ``worker.on("error")``), and a close still ends it."""
    errors: list[BaseException] = []

    async def handler(job: Job) -> None:
        return None

    w = Worker(queue_name, handler, redis_url=f"redis://127.0.0.1:{free_port()}/0", run_scheduler=False)
    w.on("error", errors.append)
    async with running(w):
        await wait_until(lambda: len(errors) >= 2, what="two failed connection attempts heard")
    assert all(isinstance(e, ConnectionError) for e in errors), errors


async def test_error_listeners_hear_a_supervised_task_that_fails_and_restarts(
    redis_url, queue_name, clients, worker_factory
) -> None:
    """A DLQ key of another type makes dead-lettering a malformed entry fail: the reader task
    fails and restarts, and the ``error`` listeners hear why."""
    k, r = QueueKeys.for_queue(queue_name), clients(redis_url)
    errors: list[BaseException] = []
    await r.set(k.dlq, b"not a stream")
    w = worker_factory(queue_name, lambda job: None, redis_url, claim_min_idle_ms=1000)
    w.on("error", errors.append)
    async with running(w):
        await r.xadd(k.stream, {"x": "no payload"})
        await wait_until(lambda: errors, what="the reader's failure heard")
        await r.delete(k.stream, k.dlq)
    assert "not a stream" in str(errors[0]) or "another type" in str(errors[0]), errors[0]


async def test_worker_listeners_hear_each_event_with_its_arguments(
    redis_url, queue_name, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)
    heard: list[tuple] = []
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    def handler(job: Job) -> int:  # a plain handler: it runs in a thread
        if job.data.get("fail"):
            raise ValueError(f"bad {job.data['fail']}")
        job.update_progress_sync(50)
        return job.data["v"] * 2

    def on_progress(job: Job, value: object) -> None:
        threads.add(threading.get_ident())
        heard.append(("progress", job.id, value))

    w = worker_factory(queue_name, handler, redis_url, concurrency=1, max_attempts=2)
    w.on("active", lambda job: heard.append(("active", job.id, job.attempt)))
    w.on("completed", lambda job, result: heard.append(("completed", job.id, result)))
    w.on("failed", lambda job, exc: heard.append(("failed", job.id, type(exc).__name__, str(exc))))
    w.on("progress", on_progress)
    drained = asyncio.Event()
    w.on("drained", drained.set)
    w.on("closed", lambda: heard.append(("closed",)))
    ok = await q.add("double", {"v": 21})
    bad = await q.add("double", {"fail": 1}, backoff=1)
    async with running(w):
        await wait_until(lambda: sum(h[0] == "failed" for h in heard) == 2, what="both failed attempts")
        await wait_until(drained.is_set, what="drained")
    assert ("completed", ok.id, 42) in heard
    assert ("progress", ok.id, 50) in heard and threads == {loop_thread}  # handed to the loop
    assert [h for h in heard if h[1:2] == (bad.id,)] == [
        ("active", bad.id, 0),
        ("failed", bad.id, "ValueError", "bad 1"),
        ("active", bad.id, 1),
        ("failed", bad.id, "ValueError", "bad 1"),
    ]
    assert heard[-1] == ("closed",)


async def test_a_raising_or_async_listener_never_stops_the_worker(
    redis_url, queue_name, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)
    done: list[str] = []
    later: list[str] = []

    async def slow(job: Job, result: object) -> None:
        await asyncio.sleep(0.01)
        later.append(job.id)

    def boom(job: Job, result: object) -> None:
        raise RuntimeError("listener bug")

    async def handler(job: Job) -> None:
        done.append(job.id)

    w = worker_factory(queue_name, handler, redis_url)
    w.on("completed", boom)
    w.on("completed", slow)
    once: list[str] = []
    w.once("completed", lambda job, _r: once.append(job.id))
    jobs = [await q.add("x", {"i": i}) for i in range(5)]
    async with running(w):
        await wait_until(lambda: len(later) == 5, what="the async listener for every job")
        w.off("completed", slow)
        extra = await q.add("x", {"i": 9})
        await wait_until(lambda: extra.id in done, what="the job after off()")
        await wait_until(lambda: _settled(q), what="every job settled")
    assert sorted(done) == sorted([j.id for j in jobs] + [extra.id])
    assert extra.id not in later and len(once) == 1


async def _settled(q) -> bool:
    return await q.count() == 0


def test_bad_listeners_are_named(redis_url, queue_name, worker_factory) -> None:
    w = worker_factory(queue_name, lambda job: None, redis_url)
    w.pause()  # before run(): a switch and its events, nothing else
    w.resume()
    assert w.is_paused() is False
    with pytest.raises(ValueError, match="no event 'complete'.*completed"):
        w.on("complete", print)
    with pytest.raises(TypeError, match="must be callable"):
        w.on("completed", "print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event name must be a str"):
        w.on(None, print)  # type: ignore[arg-type]
    events = QueueEvents(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match="1 to 1024"):
        events.on("", print)
    with pytest.raises(ValueError, match="1 to 1024"):
        events.on("x" * 1025, print)
    w.off("completed")  # nothing to remove: no error
    assert not w._listening


async def test_a_paused_worker_starts_nothing_until_resumed(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    release = asyncio.Event()
    started: list[int] = []

    async def handler(job: Job) -> None:
        started.append(job.data["i"])
        if job.data["i"] == 0:
            await release.wait()

    w = worker_factory(queue_name, handler, redis_url, concurrency=1)
    calls: list[str] = []
    w.on("paused", lambda: calls.append("paused"))
    w.on("resumed", lambda: calls.append("resumed"))
    async with running(w):
        await q.add("x", {"i": 0})
        await wait_until(lambda: started == [0], what="the first job running")
        for i in (1, 2):
            await q.add("x", {"i": i})
        await wait_until(lambda: q.get_active_count(), what="read")
        w.pause()
        w.pause()  # once is enough: one event
        assert w.is_paused() is True
        release.set()  # the running job finishes; the read-ahead ones must wait
        for i in (3, 4):
            await q.add("x", {"i": i})
        deadline = time.monotonic() + 1.5  # an observation window: nothing may start in it
        while time.monotonic() < deadline:
            assert started == [0]
            await asyncio.sleep(0.05)
        w.resume()
        await wait_until(lambda: sorted(started) == [0, 1, 2, 3, 4], what="every job after resume")
    assert calls == ["paused", "resumed"] and w.is_paused() is False


async def test_queue_events_listeners_get_typed_payloads_per_event_and_per_job(
    redis_url, queue_name, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)
    events = QueueEvents(queue_name, redis_url=redis_url, block_ms=200)
    every: list[tuple[dict, str]] = []
    mine: list[dict] = []
    progress: list[dict] = []
    seen = asyncio.Event()

    async def on_async(payload: dict, event_id: str) -> None:
        await asyncio.sleep(0)
        seen.set()

    def broken(payload: dict, event_id: str) -> None:
        raise RuntimeError("listener bug")

    async def handler(job: Job) -> str:
        await job.update_progress({"done": 3, "of": 4})
        return "ok"

    try:
        events.on("completed", broken)
        events.on("completed", lambda p, eid: every.append((p, eid)))
        events.on("completed", on_async)
        events.on("progress", lambda p, eid: progress.append(p))
        await events.wait_until_ready()
        a = await q.add("first", {})
        b = await q.add("second", {})
        events.on(f"completed:{b.id}", lambda p, eid: mine.append(p))
        async with running(worker_factory(queue_name, handler, redis_url)):
            await wait_until(lambda: len(every) == 2 and mine and len(progress) == 2, what="the events")
            await asyncio.wait_for(seen.wait(), 10)
        assert [p["jobId"] for p, _eid in every] == [a.id, b.id]
        assert [p["name"] for p, _eid in every] == ["first", "second"]
        payload, eid = every[1]
        assert payload["attempt"] == 1 and isinstance(payload["duration_us"], int) and isinstance(payload["ts"], int)
        assert mine == [payload] and eid.count("-") == 1
        assert {p["jobId"]: (p["name"], p["progress"]) for p in progress} == {
            a.id: ("first", {"done": 3, "of": 4}),
            b.id: ("second", {"done": 3, "of": 4}),
        }
        # the iterator of the same object still reads on its own cursor
        events.last_event_id = "0"
        names = []
        async for ev in events:
            names.append(ev.name)
            if ev.name == "completed" and ev.job_id == b.id:
                break
        assert names.count("completed") == 2
    finally:
        await events.close()
    assert events._dispatcher is not None and events._dispatcher.done()


async def test_wait_until_finished_gives_the_result_or_the_handler_error(
    redis_url, queue_name, queues, worker_factory, clients
) -> None:
    q = queues(queue_name, redis_url)
    events = QueueEvents(queue_name, redis_url=redis_url)

    async def handler(job: Job) -> int:
        if job.data.get("fail"):
            raise RuntimeError("the handler said no")
        return 7

    try:
        good, bad = await q.add("x", {}), await q.add("x", {"fail": True})
        async with running(worker_factory(queue_name, handler, redis_url, max_attempts=1)):  # no failure records
            assert await good.wait_until_finished(events, timeout=10) is None  # store_results is off
            with pytest.raises(JobFailed, match=r"retries_exhausted \(handler: .*the handler said no") as err:
                await bad.wait_until_finished(events, timeout=10)
            assert isinstance(err.value, RuntimeError)
        orphan = await q.add("x", {})
        with pytest.raises(TimeoutError):
            await orphan.wait_until_finished(events, timeout=0.3)
        other = QueueEvents(queue_name + "-other", redis_url=redis_url)
        with pytest.raises(ValueError, match="QueueEvents of queue"):
            await orphan.wait_until_finished(other, timeout=1)
        await other.close()
        evs = await events_of(clients(redis_url), queue_name)
        assert any(e["e"] == "failed" and e["id"] == bad.id for e in evs)
    finally:
        await events.close()


async def test_a_sharded_worker_passes_listeners_and_pause_to_every_shard(redis_url, queue_name) -> None:
    from airflow_provider_chasqui.engine.sharded import ShardedQueue, ShardedWorker

    async def handler(job: Job) -> int:
        return job.data

    sw = ShardedWorker(queue_name, handler, shards=2, redis_url=redis_url, read_block_ms=200, run_scheduler=False)
    done: dict[str, object] = {}
    sw.on("completed", lambda job, result: done.__setitem__(job.id, result))
    async with ShardedQueue(queue_name, 2, redis_url=redis_url) as sq:
        jobs = [await sq.add("x", i) for i in range(20)]
        assert len({j.id for j in jobs}) == 20
        task = asyncio.create_task(sw.run())
        try:
            await wait_until(lambda: len(done) == 20, what="every shard's jobs heard")
            sw.pause()
            assert sw.is_paused() and all(w.is_paused() for w in sw.workers)
            sw.resume()
            assert not sw.is_paused()
        finally:
            await sw.close()
            await asyncio.wait_for(task, 30)
            for shard in (f"{queue_name}.0", f"{queue_name}.1"):
                with SyncQueue(shard, redis_url=redis_url) as q:
                    q.obliterate(force=True)
    assert sorted(done.values()) == list(range(20))


async def test_close_ends_a_read_that_lost_its_cancel_before_its_block(redis_url, queue_name, queues, caplog) -> None:
    """redis-py sends through ``asyncio.wait_for``, which on Python 3.11 loses a cancel landing
    as the send finishes: the listeners' blocking read then ran its whole ``block_ms`` and
    ``close()`` waited for it.  Forced here: a read that loses its cancel and goes out after it;
    close() must return long before the 20 s block, and log no failed or unavailable reader."""
    events = QueueEvents(queue_name, redis_url=redis_url, block_ms=20_000)
    events.on("waiting", lambda payload, event_id: None)
    await events.wait_until_ready()
    sending = asyncio.Event()
    is_read = lambda call, *a: bool(call.args) and str(call.args[0]).upper() == "XREAD"  # noqa: E731
    events._driver.call = late_and_losing_the_cancel(events._driver.call, is_read, sending=sending)
    # the job's event ends the read in flight; the next read goes through the patch
    await queues(queue_name, redis_url).add("x", 1)
    await asyncio.wait_for(sending.wait(), 30)
    begun = time.monotonic()
    await events.close()
    took = time.monotonic() - begun
    assert took < 5, f"close() took {took:.1f} s: it waited out the read's block"
    noisy = [r.getMessage() for r in caplog.records if r.name.endswith("engine.events") and r.levelno >= 30]
    assert noisy == [], noisy
