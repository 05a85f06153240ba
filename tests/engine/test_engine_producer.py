"""The asyncio producer against the shared Redis: dedup by job id, add_unique, cancel_delayed,
the DLQ round trip, stored results, job state and waiting for results (blocking, no polling)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import msgpack
import pytest
from engine_support import client_lists, events_of, kv, pending_count, running, wait_until

from airflow_provider_chasqui import Job, JobFailed, Queue, QueueEvents, UnrecoverableError
from airflow_provider_chasqui.core.codec import decode_envelope, split_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver


async def _xlen_is(r, key, n) -> bool:
    return await r.xlen(key) == n


# ---- adding with ids ----------------------------------------------------------------------------


async def test_add_with_job_id_dedups_immediate_adds(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q1, q2 = queues(queue_name, redis_url), queues(queue_name, redis_url)
    a = await q1.add("order", {"v": 1}, job_id="order-42")
    b = await q1.add("order", {"v": 2}, job_id="order-42")
    c = await q2.add("order", {"v": 3}, job_id="order-42")  # another producer instance too
    assert a.id == b.id == c.id == "order-42"
    ((_eid, fields),) = await r.xrange(k.stream)
    env = decode_envelope(dict(kv(fields))["d"])
    assert env.id == "order-42" and msgpack.unpackb(env.inner) == {"v": 1}
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    async with running(worker_factory(queue_name, handler, redis_url)):
        await wait_until(lambda: seen, what="the job")
    assert [(j.id, j.data) for j in seen] == [("order-42", {"v": 1})]


async def test_add_with_job_id_dedups_delayed_adds(redis_url, queue_name, clients, queues) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    a = await q.add("later", {"v": 1}, job_id="d-1", delay=timedelta(minutes=5))
    b = await q.add("later", {"v": 2}, job_id="d-1", delay=timedelta(minutes=5))
    assert a.id == b.id == "d-1"
    ((member, score),) = await r.zrange(k.delayed, 0, -1, withscores=True)
    name, env = split_member(member)
    assert name == "later" and decode_envelope(env).id == "d-1"
    assert score == pytest.approx(a.created_at_ms + 300_000, abs=5)
    assert 3600 + 290 < await r.ttl(k.dlid("d-1")) <= 3600 + 300
    assert await q.get_job_state("d-1") == "delayed"


async def test_add_unique_returns_the_first_id_within_the_window(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q1, q2 = queues(queue_name, redis_url), queues(queue_name, redis_url)
    first = await q1.add_unique("report", {"day": 1}, window=timedelta(seconds=30))
    again = await q1.add_unique("report", {"day": 1}, window=timedelta(seconds=30))
    other_instance = await q2.add_unique("report", {"day": 1}, window=30)
    different = await q2.add_unique("report", {"day": 2}, window=30)
    assert first.id == again.id == other_instance.id
    assert different.id != first.id
    assert await r.xlen(k.stream) == 2
    # explicit keys and job ids
    keyed = await q1.add_unique("x", 1, key="k1", window=30)
    assert (await q2.add_unique("y", 2, key="k1", window=30)).id == keyed.id
    by_id = await q1.add_unique("x", 1, job_id="uniq-1", window=30)
    assert by_id.id == "uniq-1" and (await q2.add_unique("x", 9, job_id="uniq-1", window=30)).id == "uniq-1"
    assert await r.xlen(k.stream) == 4
    # a delayed unique add
    later = await q1.add_unique("z", 1, key="k2", window=30, delay=timedelta(minutes=1))
    assert (await q2.add_unique("z", 1, key="k2", window=30, delay=timedelta(minutes=1))).id == later.id
    assert await r.zcard(k.delayed) == 1
    assert split_member((await r.zrange(k.delayed, 0, 0))[0])[0] == "z"


async def test_add_unique_window_expires(redis_url, queue_name, clients, queues) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    first = await q.add_unique("w", 1, key="short", window=0.2)
    assert (await q.add_unique("w", 1, key="short", window=0.2)).id == first.id
    await wait_until(lambda: _gone(r, k.unique("short")), what="the marker to expire")
    assert (await q.add_unique("w", 1, key="short", window=0.2)).id != first.id
    assert await r.xlen(k.stream) == 2


async def _gone(r, key) -> bool:
    return await r.exists(key) == 0


async def test_add_unique_is_atomic_under_concurrency(redis_url, queue_name, clients) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    producers = [Queue(queue_name, redis_url=redis_url) for _ in range(5)]
    try:
        jobs = await asyncio.gather(*(p.add_unique("race", {"x": 1}, window=30) for p in producers for _ in range(4)))
    finally:
        for p in producers:
            await p.close()
    assert len({j.id for j in jobs}) == 1
    assert await r.xlen(k.stream) == 1


# ---- cancel_delayed -------------------------------------------------------------------------------


async def test_cancel_delayed(redis_url, queue_name, clients, queues) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    job = await q.add("c", {}, job_id="cancel-me", delay=timedelta(minutes=1))
    assert await r.zcard(k.delayed) == 1
    assert await q.cancel_delayed(job.id) is True
    assert await r.zcard(k.delayed) == 0
    assert await r.exists(k.didx("cancel-me"), k.dlid("cancel-me")) == 0
    assert await q.cancel_delayed(job.id) is False
    assert await q.cancel_delayed("never-added") is False
    # the same id can be scheduled again after a cancel
    await q.add("c", {}, job_id="cancel-me", delay=timedelta(minutes=1))
    assert await r.zcard(k.delayed) == 1
    # a plain delayed add (no job id) has no index: not cancellable (as in ChasquiMQ)
    plain = await q.add("c", {}, delay=timedelta(minutes=1))
    assert await q.cancel_delayed(plain.id) is False
    assert await r.zcard(k.delayed) == 2


async def test_cancel_after_promotion_is_false_and_the_job_runs(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    seen: list[str] = []

    async def handler(job: Job) -> None:
        seen.append(job.id)

    job = await q.add("c", {}, job_id="too-late", delay=50)
    async with running(worker_factory(queue_name, handler, redis_url, promoter_poll_ms=20)):
        await wait_until(lambda: seen, what="the promoted job")
    assert await q.cancel_delayed(job.id) is False
    assert seen == ["too-late"]


# ---- DLQ ---------------------------------------------------------------------------------------


async def test_peek_and_replay_dlq_resets_attempt(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    healthy = False
    runs: list[tuple[str, int]] = []

    async def handler(job: Job) -> str:
        runs.append((job.name, job.attempt))
        if not healthy:
            raise ValueError("down")
        return "ok"

    job = await q.add("flaky", {"p": 1}, attempts=2, backoff=1)
    await r.xadd(k.stream, {"no": "payload"})  # a malformed entry: stays in the DLQ on replay
    w = worker_factory(queue_name, handler, redis_url, promoter_poll_ms=20)
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 2), what="both dead-lettered")
        peeked = await q.peek_dlq()
        assert len(peeked) == 2
        (entry,) = [e for e in peeked if e["reason"] == "retries_exhausted"]
        assert set(entry) == {
            "dlq_id",
            "job_id",
            "source_id",
            "reason",
            "detail",
            "error",
            "traceback",
            "payload",
            "name",
        }
        assert entry["name"] == "flaky" and entry["job_id"] == job.id
        # the handler's traceback is the DLQ entry's optional `detail` (innermost frame last)
        assert entry["detail"].startswith("Traceback (most recent call last):")
        assert entry["detail"].rstrip().endswith("ValueError: down") and "in handler" in entry["detail"]
        assert entry["traceback"] == entry["detail"]
        assert entry["error"] is None  # this worker stores no failure records (store_results off)
        env = decode_envelope(entry["payload"])
        assert (env.id, env.attempt) == (job.id, 1)
        (bad,) = [e for e in peeked if e["reason"] == "malformed"]
        assert bad["payload"] == b"" and bad["name"] == "" and bad["detail"] == "missing or non-bytes payload field"
        assert bad["job_id"] is None and bad["error"] is None and bad["traceback"] is None
        assert len(await q.peek_dlq(limit=1)) == 1
        healthy = True
        assert await q.replay_dlq() == 1
        await wait_until(lambda: ("flaky", 0) in runs[2:], what="the replayed run")
        await wait_until(lambda: pending_count_is(r, queue_name, 0), what="acked")
    assert runs == [("flaky", 0), ("flaky", 1), ("flaky", 0)]  # attempt reset to 0, the name kept
    ((_id, fields),) = await r.xrange(k.dlq)
    assert dict(kv(fields))["reason"] == b"malformed"
    assert await q.replay_dlq() == 0  # undecodable entries are skipped every time


async def pending_count_is(r, queue, n) -> bool:
    return await pending_count(r, queue) == n


# ---- results, state and waiting ------------------------------------------------------------------


async def test_store_results_and_get_job_state(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)

    async def handler(job: Job):
        if job.data == "fatal":
            raise UnrecoverableError("no")
        return {"double": job.data * 2, "items": [1, "a", None]}

    ok = await q.add("calc", 21)
    bad = await q.add("calc", "fatal")
    later = await q.add("calc", 1, job_id="later-1", delay=timedelta(minutes=5))
    w = worker_factory(queue_name, handler, redis_url, store_results=True, result_ttl=timedelta(seconds=60))
    async with running(w):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="the failure")
        await wait_until(lambda: q.get_job_state(ok.id), what="a state")
        await wait_until(lambda: _is(q.get_job_state(ok.id), "completed"), what="completed")
    assert await q.get_job_result(ok.id) == {"double": 42, "items": [1, "a", None]}
    assert 0 < await r.pttl(k.result(ok.id)) <= 60_000
    assert await q.get_job_result_bulk([ok.id, bad.id, "nope"]) == [{"double": 42, "items": [1, "a", None]}, None, None]
    assert await q.get_job_state(bad.id) == "failed"
    assert await q.get_job_state(later.id) == "delayed"
    assert await q.get_job_state("never-heard-of") == "unknown"
    assert await q.get_job_result("never-heard-of") is None


async def test_get_job_state_follows_a_job_through_its_life(redis_url, queue_name, queues, worker_factory) -> None:
    """Not only ended jobs (chasquimq says ``waiting`` for an entry no worker read): a delayed job
    with a minted id is ``delayed``, one in the stream ``waiting``, one a worker runs ``active``,
    and a job that completed with no result stored ``completed`` (its event says so)."""
    q = queues(queue_name, redis_url)
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        if job.data == "hold":
            await release.wait()

    later = await q.add("s", "later", delay=timedelta(minutes=5))
    held = await q.add("s", "hold")
    behind = await q.add("s", "behind")
    assert [await q.get_job_state(j.id) for j in (later, held, behind)] == ["delayed", "waiting", "waiting"]
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=1, read_count=1)):
        await wait_until(lambda: _is(q.get_job_state(held.id), "active"), 30, what="the held job active")
        release.set()
        await wait_until(lambda: _is(q.get_job_state(behind.id), "completed"), 30, what="the job behind it done")
    assert [await q.get_job_state(j.id) for j in (later, held)] == ["delayed", "completed"]


async def _is(aw, value) -> bool:
    return (await aw) == value


async def test_without_store_results_nothing_is_kept(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    job = await q.add("calc", 1)
    async with running(worker_factory(queue_name, lambda j: "value", redis_url)):
        await wait_until(lambda: _xlen_is(r, k.stream, 0), what="processed")
        await wait_until(lambda: pending_count_is(r, queue_name, 0), what="acked")
    assert await r.exists(k.result(job.id)) == 0
    assert await q.get_job_result(job.id) is None


async def test_wait_for_result_blocks_on_the_events_stream(redis_url, queue_name, clients, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    client_name = f"waiter-{uuid.uuid4().hex[:8]}"
    q = Queue(queue_name, redis_url=redis_url, driver=AsyncDriver(redis_url, client_name=client_name))
    release = asyncio.Event()

    async def handler(job: Job) -> str:
        await release.wait()
        return f"hello {job.data}"

    try:
        async with running(worker_factory(queue_name, handler, redis_url, store_results=True)):
            job = await q.add("greet", "ada")
            waiter = asyncio.create_task(job.wait_for_result(timeout=30))
            # the waiter sits in one blocking XREAD on the events stream: no polling loop
            await wait_until(lambda: _blocked_in_xread(r, client_name), what="a blocked XREAD")
            assert not waiter.done()
            release.set()
            assert await asyncio.wait_for(waiter, 20) == "hello ada"
            # already finished: answered from the stored result without waiting
            start = time.monotonic()
            assert await q.wait_for_result(job.id, timeout=10) == "hello ada"
            assert time.monotonic() - start < 2
    finally:
        await q.close()
    assert await r.xlen(k.stream) == 0


async def _blocked_in_xread(r, client_name: str) -> bool:
    for c in await client_lists(r):  # every node of a cluster: the XREAD runs on the events key's
        if c.get("name") == client_name and c.get("cmd") == "xread" and "b" in c.get("flags", ""):
            return True
    return False


async def test_wait_for_result_raises_job_failed_for_the_dlq(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)

    async def handler(job: Job) -> None:
        raise UnrecoverableError("nope")

    async with running(worker_factory(queue_name, handler, redis_url)):  # no stored results: events only
        job = await q.add("doomed", {})
        with pytest.raises(JobFailed) as info:
            await job.wait_for_result(timeout=20)
    assert info.value.job_id == job.id and info.value.reason == "unrecoverable"


async def test_wait_for_result_after_a_stored_failure(redis_url, queue_name, clients, queues, worker_factory) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)

    async def handler(job: Job) -> None:
        raise ValueError("bad")

    job = await q.add("doomed", {}, attempts=1)
    async with running(worker_factory(queue_name, handler, redis_url, store_results=True)):
        await wait_until(lambda: _xlen_is(r, k.dlq, 1), what="dead letter")
    with pytest.raises(JobFailed) as info:
        await q.wait_for_result(job.id, timeout=5)
    assert info.value.reason == "retries_exhausted"


async def test_wait_for_result_times_out_at_the_deadline(redis_url, queue_name, queues) -> None:
    q = queues(queue_name, redis_url)
    job = await q.add("nobody-listens", {})
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await job.wait_for_result(timeout=0.5)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 3


async def test_wait_for_results_of_many(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)

    async def handler(job: Job) -> int:
        if job.data < 0:
            raise UnrecoverableError("negative")
        return job.data + 1

    async with running(worker_factory(queue_name, handler, redis_url, store_results=True)):
        jobs = await q.add_bulk([{"name": "m", "data": i} for i in (1, 2, -1)])
        outcomes = await q.wait_for_results([j.id for j in jobs], timeout=20)
    assert outcomes[jobs[0].id] == ("completed", 2)
    assert outcomes[jobs[1].id] == ("completed", 3)
    assert outcomes[jobs[2].id][:2] == ("failed", "unrecoverable")


async def test_queue_events_follow_new_events(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    events = QueueEvents(queue_name, redis_url=redis_url, block_ms=200)
    got = []

    async def follow() -> None:
        async for ev in events:
            got.append(ev)
            if ev.name == "completed":
                return

    try:
        follower = asyncio.create_task(follow())
        await wait_until(lambda: events.last_event_id != "$", what="the cursor pinned")
        async with running(worker_factory(queue_name, lambda j: None, redis_url)):
            job = await q.add("evt", {})
            await asyncio.wait_for(follower, 20)
    finally:
        await events.close()
    assert [e.name for e in got if e.job_id == job.id] == ["active", "completed"]
    active = got[0]
    assert (active.job_id, active.job_name, active.fields) == (job.id, "evt", {"attempt": "1"})
    assert active.ts_ms > 0 and active.event_id


async def test_wait_for_result_sees_through_a_retry(redis_url, queue_name, queues, worker_factory) -> None:
    """A ``failed`` event followed by a retry is not the end: the later completion is."""
    q = queues(queue_name, redis_url)

    async def handler(job: Job) -> str:
        if job.attempt == 0:
            raise ValueError("first run fails")
        return f"ok on run {job.attempt + 1}"

    async with running(worker_factory(queue_name, handler, redis_url, store_results=True, promoter_poll_ms=20)):
        job = await q.add("retry-then-ok", {}, backoff=10)
        # chasquimq 1.3 callers pass poll_interval; it is accepted and unused (we block, never poll)
        assert await job.wait_for_result(timeout=20, poll_interval=0.5) == "ok on run 2"
    assert job.attempts_made == 0


async def test_a_promoted_job_is_no_longer_delayed(redis_url, queue_name, clients, queues, worker_factory) -> None:
    """The promoter removes the didx side index with the member (spec 11.1), so the job's
    state stops saying "delayed" the moment it is promoted."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    seen: list[str] = []
    job = await q.add("p", {}, job_id="promote-me", delay=50)
    assert await q.get_job_state(job.id) == "delayed"
    async with running(worker_factory(queue_name, lambda j: seen.append(j.id), redis_url, promoter_poll_ms=20)):
        await wait_until(lambda: seen == ["promote-me"], what="the promoted job")
    assert await r.exists(k.didx("promote-me")) == 0
    assert await q.get_job_state(job.id) == "completed"  # no result stored: its completed event says so
    waiting = [e for e in await events_of(r, queue_name) if e["e"] == "waiting"]
    assert [e["id"] for e in waiting] == ["promote-me"]
