"""chasquimq's introspection API (``core/listing.py``): ``get_job_counts``, ``count`` and the
``get_*_count`` helpers, ``get_jobs`` pages, ``get_job`` and ``Queue(consumer_group=)``, with a
real worker moving jobs between states, deep offsets, hostile entries and keys, bad arguments,
the sync twin, every server of the matrix and the cluster."""

from __future__ import annotations

import asyncio
import math
import uuid

import msgpack
import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui import Job, Queue, ShardedQueue, SyncQueue, SyncShardedQueue, UnrecoverableError
from airflow_provider_chasqui.core import listing
from airflow_provider_chasqui.core.codec import Envelope, encode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000


def _data(jobs: list[Job]) -> list[object]:
    return [j.data for j in jobs]


async def _is(count: object, value: int) -> bool:
    return await count == value  # type: ignore[misc]


async def test_counts_and_pages_follow_jobs_through_every_state(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)
    assert await q.get_job_counts() == dict.fromkeys(listing.COUNT_TYPES, 0)
    release = asyncio.Event()
    started: list[str] = []

    async def handler(job: Job) -> str:
        if job.data.get("fail"):
            raise UnrecoverableError("no")
        if job.data.get("hold"):
            started.append(job.id)
            await release.wait()
        return "ok"

    done = [await q.add("quick", {"i": i}) for i in range(3)]
    failed = await q.add("bad", {"fail": True})
    w = worker_factory(queue_name, handler, redis_url, concurrency=1)
    async with running(w):
        await wait_until(lambda: q.get_failed_count(), what="the failing job in the DLQ")
        await wait_until(lambda: _is(q.count(), 0), what="the first jobs settled")
        held = await q.add("slow", {"hold": True})
        await wait_until(lambda: started, what="the held job running")
        later = [await q.add("later", {"d": i}, delay_ms=HOUR_MS * (3 - i)) for i in range(3)]
        waiting = [await q.add("w", {"n": i}) for i in range(2)]  # the one slot is held: they wait
        await wait_until(lambda: q.get_active_count(), what="the held job active")
        assert held.id in [j.id for j in await q.get_jobs("active")]
        counts = await q.get_job_counts()
        assert counts["active"] >= 1 and counts["delayed"] == 3 and counts["failed"] == 1
        assert counts["waiting"] + counts["active"] == 3  # the held job and the two (read ahead or not)
        assert await q.count() == counts["waiting"] + counts["active"] + counts["delayed"] == 6
        # delayed: soonest first (the last one added is due first)
        assert [j.id for j in await q.get_jobs("delayed")] == [j.id for j in reversed(later)]
        assert [j.id for j in await q.get_jobs("delayed", 1, 1)] == [later[1].id]
        (dead,) = await q.get_jobs("failed")
        assert (dead.id, dead.name, dead.data) == (failed.id, "bad", {"fail": True})
        got = await q.get_job(waiting[-1].id)
        assert got is not None and (got.name, got.data) == ("w", {"n": 1})
        release.set()
        await wait_until(lambda: _is(q.count(), 3), what="every job but the delayed settled")
    # the worker wrote its history at its stop: 6 completed runs
    counts = await q.get_job_counts("completed", "failed", "waiting")
    assert list(counts) == ["completed", "failed", "waiting"]
    assert counts == {"completed": 6, "failed": 1, "waiting": 0}
    assert await q.get_completed_count() == 6
    completed = await q.get_jobs("completed", limit=10)
    assert len(completed) == 6 and all(j.data is None for j in completed)
    assert completed[-1].id == done[0].id  # newest first
    assert (await q.get_job(done[0].id)).data is None  # completed: no data kept
    assert (await q.get_job(done[0].id)).name == "quick"
    assert await q.get_jobs("failed", offset=1) == []


async def test_waiting_pages_run_through_the_stream_then_the_prioritized_set(
    redis_url, queue_name, queues, monkeypatch
) -> None:
    q = queues(queue_name, redis_url)
    for i in range(7):
        await q.add("w", {"n": i})
    await q.add("p", {"p": 3}, priority=3)
    await q.add("p", {"p": 1}, priority=1)
    everything = [{"n": i} for i in range(7)] + [{"p": 1}, {"p": 3}]
    assert await q.get_waiting_count() == 9
    assert _data(await q.get_jobs("waiting")) == everything
    monkeypatch.setattr(listing, "SKIP_STEP", 2)  # skips take several looks inside Redis
    for offset in range(11):
        for limit in (1, 2, 5):
            page = await q.get_jobs("waiting", offset=offset, limit=limit)
            assert _data(page) == everything[offset : offset + limit], (offset, limit)


async def test_pages_skip_past_the_group_read_entries_and_follow_the_consumer_group(
    redis_url, queue_name, clients, queues
) -> None:
    r, k = clients(redis_url), QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    jobs = [await q.add("w", {"n": i}) for i in range(5)]
    await r.xgroup_create(k.stream, "default", id="0")
    await r.xreadgroup("default", "c1", {k.stream: ">"}, count=2)  # two read (active), three not
    assert await q.get_job_counts("waiting", "active") == {"waiting": 3, "active": 2}
    assert _data(await q.get_jobs("waiting")) == [{"n": 2}, {"n": 3}, {"n": 4}]
    assert [j.id for j in await q.get_jobs("active")] == [jobs[0].id, jobs[1].id]
    assert [j.id for j in await q.get_jobs("active", offset=1)] == [jobs[1].id]
    # another group's view: it never read anything
    other = queues(queue_name, redis_url, consumer_group="reports")
    assert await other.get_job_counts("waiting", "active") == {"waiting": 5, "active": 0}
    assert len(await other.get_jobs("waiting")) == 5 and await other.get_jobs("active") == []
    assert (await other.inspect()).group_exists is False
    assert await other.get_job_state(jobs[0].id) == "waiting"
    assert await q.get_job_state(jobs[0].id) == "active"


async def test_get_job_reads_data_name_and_attempt_as_stored(redis_url, queue_name, queues) -> None:
    q = queues(queue_name, redis_url)
    assert await q.get_job("no-such-job") is None
    a = await q.add("send-email", {"to": "ada"})
    fetched = await q.get_job(a.id)
    assert fetched is not None
    assert (fetched.id, fetched.name, fetched.data, fetched.attempt) == (a.id, "send-email", {"to": "ada"}, 0)
    assert abs(fetched.created_at_ms - a.created_at_ms) <= 5
    d = await q.add("later", [1, 2], delay_ms=HOUR_MS, job_id="stable-id")
    assert (await q.get_job(d.id)).data == [1, 2]
    # the Job is bound to its queue: waiting on it works
    assert fetched._queue is q


async def test_hostile_entries_and_keys_never_fail_a_listing(redis_url, queue_name, clients, queues) -> None:
    r, k = clients(redis_url), QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    good = await q.add("ok", {"v": 1})
    await r.xadd(k.stream, {"x": "not a job"})  # no envelope: left out of pages
    await r.xadd(k.stream, {"d": b"\xc1\xff", "n": "\xff"})  # not msgpack
    junk = Envelope("raw-data", b"\xc1", 1, 0)  # an envelope whose data is no msgpack
    await r.xadd(k.stream, {"d": encode_envelope(junk), "n": "junk"})
    await r.zadd(k.delayed, {b"\x00": 1, b"\xff\xff\xff\xff": 2})  # members that are no job
    page = await q.get_jobs("waiting")
    assert [(j.id, j.data) for j in page] == [(good.id, {"v": 1}), ("raw-data", b"\xc1")]
    assert await q.get_jobs("delayed") == []
    assert await q.get_job_counts("waiting", "delayed") == {"waiting": 4, "delayed": 2}
    for key in (k.stream, k.delayed, k.dlq, k.events, k.prioritized):
        await r.delete(key)
        await r.set(key, "spoiled")
    for state in listing.JOB_STATES:
        assert await q.get_jobs(state) == []
    assert await q.get_job_counts("waiting", "active", "delayed", "failed") == dict.fromkeys(
        ("waiting", "active", "delayed", "failed"), 0
    )


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (("nope",), ValueError, "unknown state"),
        ((3,), TypeError, "state must be a str"),
        (("waiting", -1), ValueError, "offset"),
        (("waiting", 0, 0), ValueError, "limit"),
        (("waiting", 0, 10_001), ValueError, "limit"),
        (("waiting", listing.MAX_OFFSET + 1), ValueError, "offset"),
        (("waiting", True), TypeError, "offset must be an int"),
        (("waiting", 0, 2.0), TypeError, "limit must be an int"),
        (("waiting", 0, math.inf), TypeError, "limit must be an int"),
    ],
)
async def test_bad_page_arguments_are_named(redis_url, queue_name, queues, args, error, words) -> None:
    q = queues(queue_name, redis_url)
    with pytest.raises(error, match=words):
        await q.get_jobs(*args)


async def test_bad_count_types_and_consumer_groups_are_named(redis_url, queue_name, queues) -> None:
    q = queues(queue_name, redis_url)
    with pytest.raises(ValueError, match="unknown job count type 'queued'"):
        await q.get_job_counts("waiting", "queued")
    with pytest.raises(TypeError, match="must be a str"):
        await q.get_job_counts(1)  # type: ignore[arg-type]
    for bad in ("", 5, None, "x" * 300):
        with pytest.raises(ValueError, match="consumer_group"):
            Queue(queue_name, redis_url=redis_url, consumer_group=bad)  # type: ignore[arg-type]


def test_the_sync_twin_answers_alike(redis_url, queue_name) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        jobs = [q.add("w", {"n": i}) for i in range(3)]
        q.add("d", {"d": 1}, delay_ms=HOUR_MS)
        assert q.get_job_counts("waiting", "delayed", "paused") == {"waiting": 3, "delayed": 1, "paused": 0}
        assert q.count() == 4 and q.get_waiting_count() == 3 and q.get_delayed_count() == 1
        assert q.get_active_count() == q.get_failed_count() == q.get_completed_count() == 0
        assert [j.id for j in q.get_jobs("waiting", 1, 5)] == [jobs[1].id, jobs[2].id]
        got = q.get_job(jobs[0].id)
        assert got is not None and (got.name, got.data, got._queue) == ("w", {"n": 0}, q)
        assert q.get_job("nothing") is None
        q.pause()
        assert q.get_job_counts("paused") == {"paused": 1}
        with pytest.raises(ValueError, match="unknown state"):
            q.get_jobs("done")


async def test_counts_are_one_instants_while_jobs_retry(redis_url, queue_name, queues, worker_factory) -> None:
    """Jobs failing over and over move from the stream to the delayed set and back (1 ms
    backoff) while counts are read: every read finds each of them exactly once."""
    q = queues(queue_name, redis_url)
    n = 12

    async def handler(job: Job) -> None:
        raise RuntimeError("again")

    for i in range(n):
        await q.add("r", {"i": i}, attempts=1_000_000, backoff=1)
    seen: set[str] = set()
    reads = 0
    w = worker_factory(queue_name, handler, redis_url, concurrency=4)
    async with running(w):
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while loop.time() < end and (reads < 300 or len(seen) < 3):
            counts = await q.get_job_counts("waiting", "active", "delayed", "failed")
            reads += 1
            assert counts["waiting"] + counts["active"] + counts["delayed"] == n, counts
            assert counts["failed"] == 0, counts
            seen.update(state for state in ("waiting", "active", "delayed") if counts[state])
    assert seen == {"waiting", "active", "delayed"}, f"the jobs never moved through every state in {reads} reads"


async def test_a_sharded_queue_counts_every_shard(redis_url, queue_name) -> None:
    async with ShardedQueue(queue_name, shards=3, redis_url=redis_url) as sq:
        for i in range(9):
            await sq.add("w", {"i": i}, job_id=f"job-{i}")  # routed by its id: the same shards every run
        await sq.add("d", {}, delay_ms=HOUR_MS)
        per = [await q.get_job_counts("waiting", "delayed") for q in sq.queues]
        assert sum(c["waiting"] for c in per) == 9 and sum(1 for c in per if c["waiting"]) >= 2  # spread
        assert await sq.get_job_counts("waiting", "delayed", "paused") == {"waiting": 9, "delayed": 1, "paused": 0}
        assert await sq.count() == 10
        await sq.queues[0].pause()
        assert (await sq.get_job_counts("paused"))["paused"] == 0  # not every shard
        await sq.pause()
        assert (await sq.get_job_counts("paused"))["paused"] == 1
        for q in sq.queues:
            await q.obliterate(force=True)
    with SyncShardedQueue(queue_name, shards=2, redis_url=redis_url) as ssq:
        ssq.add("w", {})
        assert ssq.get_job_counts("waiting") == {"waiting": 1} and ssq.count() == 1
        for q in ssq.queues:
            q.obliterate(force=True)


async def test_counts_and_pages_on_every_server(matrix_url, queue_name, queues) -> None:
    q = queues(queue_name, matrix_url.url, fast_paths=not matrix_url.force_compat)
    added = [await q.add("w", {"n": i}) for i in range(4)]
    await q.add("d", {"d": 1}, delay_ms=HOUR_MS)
    await q.add("p", {"p": 1}, priority=2)
    assert await q.get_job_counts("waiting", "delayed") == {"waiting": 5, "delayed": 1}
    assert _data(await q.get_jobs("waiting", 2, 3)) == [{"n": 2}, {"n": 3}, {"p": 1}]
    assert (await q.get_job(added[1].id)).data == {"n": 1}


async def test_counts_and_pages_on_the_cluster(cluster_server, queues) -> None:
    name = f"listing-{uuid.uuid4().hex}"
    q = queues(name, cluster_server.url)
    try:
        for i in range(3):
            await q.add("w", {"n": i})
        assert await q.count() == 3
        assert _data(await q.get_jobs("waiting", 1)) == [{"n": 1}, {"n": 2}]
    finally:
        await q.obliterate(force=True)


def test_msgpack_of_a_page_is_the_wire_data() -> None:
    """A page decodes job data with the codec every worker uses (msgpack, raw bytes kept)."""
    row = listing._entry_row({"d": encode_envelope(Envelope("j", msgpack.packb({"a": b"\x00"}), 5, 2)), "n": b"n"})
    assert row == ("j", "n", {"a": b"\x00"}, 2, 5, None, None)


async def test_drain_and_obliterate_return_counts_as_chasquimq_with_their_parts(redis_url, queue_name, queues) -> None:
    from airflow_provider_chasqui.core.maintenance import DrainReport, ObliterateReport

    q = queues(queue_name, redis_url)
    assert await q.obliterate() == 0 and await q.obliterate() == 0  # an empty queue, twice
    for n in range(6):
        await q.add("w", {"n": n})
    for n in range(3):
        await q.add("d", {"n": n}, delay_ms=HOUR_MS)
    report = await q.drain()
    assert report == 9 and isinstance(report, int) and (report.waiting, report.delayed) == (6, 3)
    assert report == DrainReport(waiting=6, delayed=3) and report != DrainReport(waiting=5, delayed=4)
    assert repr(report) == "DrainReport(waiting=6, delayed=3)" and report.to_dict() == {"waiting": 6, "delayed": 3}
    with pytest.raises(AttributeError, match="read-only"):
        report.waiting = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes waiting, delayed"):
        DrainReport(waiting=1)
    await q.add("w", {})
    await q.add("d", {}, delay_ms=HOUR_MS)
    assert await q.drain(delayed=False) == 1 and await q.get_job_counts("waiting", "delayed") == {
        "waiting": 0,
        "delayed": 1,
    }
    await q.add("w", {})
    gone = await q.obliterate()
    assert isinstance(gone, ObliterateReport) and gone >= 2
    assert int(gone) == gone.keys + gone.indexed + (gone.swept or 0)
    assert await q.count() == 0
    assert (await q.add("w", {"again": True})).id and await q.get_waiting_count() == 1  # usable after
