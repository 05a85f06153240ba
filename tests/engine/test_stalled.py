"""chasquimq's stalled-job detector (``Worker(max_stalled_attempts=, stalled_detector_enabled=)``,
``Worker.on("stalled")``): a job reclaimed from a consumer that stopped renewing it (a dead or
frozen worker) is a ``stalled`` event and reaches the ``stalled`` listeners; the
``max_stalled_attempts``-th reclaim of one entry dead-letters it with reason ``stalled``
instead of running it again; handler failures never count as stalls; with the detector off a
reclaimed job still runs (nothing is lost), silently.  A "dead consumer" here is a real group
consumer that read the entry with ``XREADGROUP`` and never renewed or acknowledged it."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from engine_support import events_of, running, wait_until

from airflow_provider_chasqui import ConfigError, Job, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.retry import RetryPolicy
from airflow_provider_chasqui.worker.metrics import PrometheusMetrics

pytestmark = pytest.mark.timeout(90)

HOSTILE_ID = "job\x00\xff\u202e:{x}\r\n*3"


async def _grouped(redis_url: str, queue_name: str, clients: Any, queues: Any) -> tuple[QueueKeys, Any, Any]:
    """The queue's keys, a raw client and a producer, its group made (the ghosts read from it)."""
    k, r, q = QueueKeys.for_queue(queue_name), clients(redis_url), queues(queue_name, redis_url)
    await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    return k, r, q


async def _held_by_ghosts(r: Any, stream: str, ghosts: int) -> None:
    """The queue's entries read by a consumer that dies holding them, then taken over (XCLAIM,
    as a recovery pass does) by ``ghosts - 1`` more that die too: ``ghosts`` deliveries, so
    ``ghosts - 1`` stalls before the worker's."""
    await r.xreadgroup("default", "ghost-0", {stream: ">"}, count=100)
    for i in range(1, ghosts):
        ids = [row["message_id"] for row in await r.xpending_range(stream, "default", "-", "+", 100)]
        await r.xclaim(stream, "default", f"ghost-{i}", 0, ids)


async def test_a_job_taken_from_a_dead_consumer_is_a_stalled_event_and_runs(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k, r, q = await _grouped(redis_url, queue_name, clients, queues)
    named = await q.add("send-email", {"v": 1})
    hostile = await q.add("", {"v": 2}, job_id=HOSTILE_ID)
    await _held_by_ghosts(r, k.stream, 1)
    done: list[str] = []
    heard: list[tuple[str, str]] = []
    sink = PrometheusMetrics()
    w = worker_factory(queue_name, lambda job: done.append(job.id), redis_url, claim_min_idle_ms=300, metrics=sink)
    w.on("stalled", lambda job_id, prev: heard.append((job_id, prev)))
    async with running(w):
        await wait_until(lambda: sorted(done) == sorted([named.id, hostile.id]), 20, what="both jobs run")
        await wait_until(lambda: len(heard) == 2, 10, what="both stalls heard")
    assert sorted(heard) == sorted([(named.id, "active"), (HOSTILE_ID, "active")])
    stalled = [e for e in await events_of(r, queue_name) if e["e"] == "stalled"]
    assert sorted((e["id"], e.get("n"), e["attempt"]) for e in stalled) == sorted(
        [(named.id, "send-email", "1"), (HOSTILE_ID, None, "1")]
    )
    assert await r.xlen(k.dlq) == 0
    assert sink.registry.get_sample_value("chasqui_jobs_stalled_total", {"queue": queue_name}) == 2


async def test_the_max_stalled_attempts_th_stall_dead_letters_the_job_unrun(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """``max_stalled_attempts=2``: a job with one stall behind it runs; a job whose entry was
    already taken over once (this is its second stall) goes to the DLQ as ``stalled``, its
    ``stalled`` event before its ``dlq`` event; ``max_attempts`` (25) is nowhere near."""
    k, r, q = await _grouped(redis_url, queue_name, clients, queues)
    twice = await q.add("twice", {})
    await _held_by_ghosts(r, k.stream, 2)
    once = await q.add("once", {})
    await _held_by_ghosts(r, k.stream, 1)
    done: list[str] = []
    heard: list[str] = []
    w = worker_factory(
        queue_name, lambda job: done.append(job.id), redis_url, claim_min_idle_ms=300, max_stalled_attempts=2
    )
    w.on("stalled", lambda job_id, prev: heard.append(job_id))
    async with running(w):
        await wait_until(lambda: done == [once.id], 20, what="the once-stalled job to run")
        await wait_until(lambda: r.xlen(k.dlq), 20, what="the twice-stalled job to be dead-lettered")
    assert sorted(heard) == sorted([once.id, twice.id])
    [(_, dlq)] = await r.xrange(k.dlq)
    assert dlq[b"reason"] == b"stalled" and b"reclaimed 2 times" in dlq[b"detail"], dlq
    events = [(e["e"], e.get("reason")) for e in await events_of(r, queue_name) if e["id"] == twice.id]
    assert events == [("stalled", None), ("dlq", "stalled")], events
    assert twice.id not in done


async def test_handler_failures_are_not_stalls(redis_url, queue_name, queues) -> None:
    """chasquimq's ``test_max_stalled_attempts_routes_to_stalled_detector``: an always-failing
    handler with ``max_stalled_attempts=2, max_attempts=5`` runs 5 times (bounded by
    ``max_attempts``) and is dead-lettered ``retries_exhausted``, never ``stalled``."""
    q = queues(queue_name, redis_url)
    attempts: list[int] = []
    stalls: list[str] = []

    async def handler(job: Job) -> None:
        attempts.append(job.attempt)
        raise RuntimeError("always-fail")

    w = Worker(
        queue_name,
        handler,
        redis_url=redis_url,
        run_scheduler=False,
        concurrency=1,
        max_stalled_attempts=2,
        max_attempts=5,
        read_block_ms=100,
        retry=RetryPolicy(initial_ms=1, max_ms=5, jitter_ms=0),
    )
    w.on("stalled", stalls.append)
    async with running(w):
        await q.add("regular", {"value": 1})
        await wait_until(lambda: len(attempts) >= 5, 30, what="five attempts")
        dlq = await wait_until(lambda: q.peek_dlq(5), 20, what="the job dead-lettered")
    assert attempts == [0, 1, 2, 3, 4] and stalls == []
    assert [e["reason"] for e in dlq] == ["retries_exhausted"], dlq


async def test_with_the_detector_off_a_reclaimed_job_runs_silently(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """``stalled_detector_enabled=False``: no ``stalled`` event or listener call, no stall
    limit (``max_stalled_attempts=1`` is ignored), and still nothing lost: the job runs; no
    detector lock key (chasquimq's ``{chasqui:<q>}:stalled:lock``) ever exists."""
    k, r, q = await _grouped(redis_url, queue_name, clients, queues)
    job = await q.add("held", {})
    await _held_by_ghosts(r, k.stream, 3)
    done: list[str] = []
    heard: list[str] = []
    w = worker_factory(
        queue_name,
        lambda job: done.append(job.id),
        redis_url,
        claim_min_idle_ms=300,
        stalled_detector_enabled=False,
        max_stalled_attempts=1,
    )
    w.on("stalled", heard.append)
    async with running(w):
        await wait_until(lambda: done == [job.id], 20, what="the held job to run")
    assert heard == [] and await r.xlen(k.dlq) == 0
    assert [e for e in await events_of(r, queue_name) if e["e"] == "stalled"] == []
    assert await r.exists(f"{{chasqui:{queue_name}}}:stalled:lock") == 0


async def test_a_stalled_listener_that_raises_or_is_async_never_stops_the_worker(
    redis_url, queue_name, clients, queues, worker_factory
) -> None:
    k, r, q = await _grouped(redis_url, queue_name, clients, queues)
    first = await q.add("held", {})
    await _held_by_ghosts(r, k.stream, 1)
    done: list[str] = []
    heard: list[str] = []

    async def later(job_id: str, prev: str) -> None:
        await asyncio.sleep(0)
        heard.append(job_id)

    def boom(job_id: str, prev: str) -> None:
        raise RuntimeError("listener bug")

    w = worker_factory(queue_name, lambda job: done.append(job.id), redis_url, claim_min_idle_ms=300)
    w.on("stalled", boom)
    w.on("stalled", later)
    async with running(w):
        await wait_until(lambda: heard == [first.id], 20, what="the async listener to hear the stall")
        second = await q.add("fresh", {})
        await wait_until(lambda: done == [first.id, second.id], 20, what="the worker to go on")


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"max_stalled_attempts": 0}, "max_stalled_attempts"),
        ({"max_stalled_attempts": -1}, "max_stalled_attempts"),
        ({"max_stalled_attempts": True}, "max_stalled_attempts"),
        ({"max_stalled_attempts": 1.5}, "max_stalled_attempts"),
        ({"max_stalled_attempts": math.inf}, "max_stalled_attempts"),
        ({"max_stalled_attempts": "2"}, "max_stalled_attempts"),
        ({"max_stalled_attempts": 2**32}, "max_stalled_attempts"),
        ({"stalled_detector_enabled": "yes"}, "stalled_detector_enabled"),
        ({"stalled_detector_enabled": 1}, "stalled_detector_enabled"),
    ],
)
def test_bad_stall_options_are_refused_naming_them(options: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        Worker("q", lambda job: None, redis_url="redis://127.0.0.1:1/0", **options)


async def test_a_running_jobs_stalled_count_is_its_take_overs(redis_url, queue_name, clients, queues) -> None:
    """chasquimq's ``test_job_stalled_count_active_only``: a waiting job's ``stalled_count`` is
    None (not 0: nothing has looked); a running job's, read back with ``get_job`` or
    ``get_jobs("active")``, is the times its entry was taken over (0 for one never taken over,
    3 for one this worker took from the third of three dead consumers).  A long handler on a
    live worker is no stall here (its lease is renewed), unlike chasquimq's detector, which
    counts a hung handler."""
    k, r, q = await _grouped(redis_url, queue_name, clients, queues)
    taken = await q.add("taken", {})
    await _held_by_ghosts(r, k.stream, 3)
    waiting = await q.add("waiting", {})
    assert (await q.get_job(waiting.id)).stalled_count is None
    release = asyncio.Event()
    started: list[str] = []

    async def hang(job: Job) -> None:
        started.append(job.id)
        await release.wait()

    w = Worker(queue_name, hang, redis_url=redis_url, run_scheduler=False, read_block_ms=200, claim_min_idle_ms=400)
    async with running(w):
        try:
            await wait_until(lambda: sorted(started) == sorted([taken.id, waiting.id]), 20, what="both jobs to run")
            await asyncio.sleep(1.0)  # two and a half leases: renewed, so never taken over again
            assert (await q.get_job(taken.id)).stalled_count == 3
            assert (await q.get_job(waiting.id)).stalled_count == 0
            active = {j.id: j.stalled_count for j in await q.get_jobs("active", 0, 10)}
            assert active == {taken.id: 3, waiting.id: 0}
        finally:
            release.set()
        await wait_until(lambda: _active_is(q, 0), 10, what="nothing active")
    assert (await q.get_job(taken.id)).stalled_count is None  # completed: running no more


async def _active_is(q: Any, n: int) -> bool:
    return (await q.get_job_counts("active"))["active"] == n
