"""Timeouts that stop the job (issue 25, ``core/running.py``).

A job's own ``timeout_ms`` (kept beside it in ``{q}:to:<id>``), its handler's, or the worker's
``job_timeout_ms``: an attempt past it is stopped and fails with reason ``timeout``, then
follows the retry policy.  Real servers, in-process workers, and one worker *process* (the
``fault_support.py worker`` recorder) on Redis 7.0 and Valkey 8.1.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
import redis
from engine_support import events_of, running, wait_until, wait_until_sync
from fault_support import read_records, spawn_worker

from airflow_provider_chasqui import ConfigError, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.running import MAX_TIMEOUT_MS, TIMEOUT_ATTR, check_timeout_ms, parse_timeout
from airflow_provider_chasqui.worker.registry import HandlerRegistry, bind, handler

pytestmark = pytest.mark.timeout(120)


def _by_id(events: list[dict[str, str]], job_id: str, kind: str) -> list[dict[str, str]]:
    return [e for e in events if e.get("id") == job_id and e.get("e") == kind]


async def test_an_async_handler_past_its_timeout_fails_with_reason_timeout_and_is_retried(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """A handler sleeping 60 s under ``timeout_ms=1000``: each attempt fails within 2 s with a
    ``timeout`` reason, the first is retried, the second dead-lettered (attempts=2); the other
    job on the queue completes meanwhile, and the timeout's key is gone at the end."""
    q = queues(queue_name, redis_url)
    started: list[float] = []

    async def h(job):
        if job.name == "sleepy":
            started.append(time.monotonic())
            await asyncio.sleep(60)
        return "ok"

    async with running(worker_factory(queue_name, h, redis_url, store_results=True, concurrency=4)):
        slow = await q.add("sleepy", {}, timeout_ms=1000, attempts=2, backoff=50)
        quick = await q.add("quick", {})
        assert await quick.wait_for_result(timeout=30) == "ok"
        failure = await wait_until(lambda: q.get_failure(slow.id), 30, what="the dead-lettered job")
    assert len(started) == 2, started
    assert failure.reason == "retries_exhausted"
    assert failure.error.startswith("timeout:") and "1000 ms" in failure.error
    r = clients(redis_url)
    events = await events_of(r, queue_name)
    fails = _by_id(events, slow.id, "failed")
    assert [e["attempt"] for e in fails] == ["1", "2"]
    assert all(e["reason"].startswith("timeout:") for e in fails)
    assert [int(e["duration_us"]) < 2_000_000 for e in fails] == [True, True], fails
    assert len(_by_id(events, slow.id, "retry-scheduled")) == 1
    assert await r.exists(QueueKeys.for_queue(queue_name).job_timeout(slow.id)) == 0


async def test_which_timeout_applies_job_then_handler_then_worker(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """The job's own timeout beats its handler's, which beats the worker's default; a job of a
    handler without one runs under the default; a job under none runs to its end."""
    q = queues(queue_name, redis_url)

    async def sleeper(job):
        await asyncio.sleep(job.data["secs"])
        return "done"

    async def patient(job):
        await asyncio.sleep(job.data["secs"])
        return "done"

    setattr(sleeper, TIMEOUT_ATTR, 300)  # the handler's own
    table = {"own": sleeper, "handler": sleeper, "default": patient}
    # Margins of a second or more each way: a loaded CI machine (two suites on two cores, a
    # cluster) once stalled a 0.2 s sleep past a 0.6 s default.
    worker = worker_factory(queue_name, table, redis_url, store_results=True, job_timeout_ms=1500, concurrency=10)
    async with running(worker):
        own = await q.add("own", {"secs": 0.5}, timeout_ms=5000, attempts=1)  # 5 s beats the handler's 0.3 s
        by_handler = await q.add("handler", {"secs": 10}, attempts=1)  # 0.3 s: times out
        by_default = await q.add("default", {"secs": 10}, attempts=1)  # 1.5 s: times out
        within = await q.add("default", {"secs": 0.05}, attempts=1)
        assert await own.wait_for_result(timeout=30) == "done"
        assert await within.wait_for_result(timeout=30) == "done"
        for job, ms in ((by_handler, 300), (by_default, 1500)):
            failure = await wait_until(lambda j=job: q.get_failure(j.id), 30, what=f"{job.id} to fail")
            assert failure.error.startswith("timeout:") and f"{ms} ms" in failure.error, failure


async def test_a_thread_handler_past_its_timeout_frees_its_slot(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A plain handler blocked in its thread cannot be stopped: its attempt fails at the
    deadline and the worker's only slot runs the next job at once (the thread ends later)."""
    q = queues(queue_name, redis_url)
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def blocking(job):
        if job.data == "block":
            fut = asyncio.run_coroutine_threadsafe(release.wait(), loop)
            fut.result(timeout=30)
        return job.data

    async with running(worker_factory(queue_name, blocking, redis_url, store_results=True, concurrency=1)):
        stuck = await q.add("b", "block", timeout_ms=500, attempts=1)
        after = await q.add("b", "after")
        t0 = time.monotonic()
        assert await after.wait_for_result(timeout=30) == "after"
        assert time.monotonic() - t0 < 10
        failure = await wait_until(lambda: q.get_failure(stuck.id), 30, what="the blocked job to fail")
        assert failure.error.startswith("timeout:")
        release.set()


async def test_a_handlers_own_timeout_error_is_not_a_timeout(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)

    async def h(job):
        raise TimeoutError("the partner API timed out")

    async with running(worker_factory(queue_name, h, redis_url, job_timeout_ms=10_000, store_results=True)):
        job = await q.add("h", {}, attempts=1)
        failure = await wait_until(lambda: q.get_failure(job.id), 30, what="the job to fail")
    assert failure.error.startswith("handler: Python handler raised: TimeoutError"), failure.error


async def test_every_way_in_keeps_the_jobs_timeout(redis_url: str, queue_name: str, queues, worker_factory) -> None:
    """add_bulk items, a delayed job, a job with a caller id, a prioritized and a grouped job:
    each runs under its own timeout (each would otherwise sleep for 60 s)."""
    q = queues(queue_name, redis_url)

    async def h(job):
        await asyncio.sleep(60)

    async with running(worker_factory(queue_name, h, redis_url, concurrency=20, store_results=True)):
        jobs = await q.add_bulk(
            [
                {"name": "a", "data": 1, "timeout_ms": 400, "attempts": 1},
                {"name": "a", "data": 2, "timeout_ms": 400, "attempts": 1, "delay_ms": 300},
                {"name": "a", "data": 3, "timeout_ms": 400, "attempts": 1, "group": "tenant"},
            ]
        )
        jobs += [
            await q.add("a", 4, timeout_ms=400, attempts=1, delay_ms=200),
            await q.add("a", 5, timeout_ms=400, attempts=1, job_id=f"{queue_name}-own-id"),
            await q.add("a", 6, timeout_ms=400, attempts=1, priority=3),
            await q.add("a", 7, timeout_ms=400, attempts=1, group="tenant"),
            await q.add_unique("a", 8, timeout_ms=400, attempts=1),
        ]
        for job in jobs:
            failure = await wait_until(lambda j=job: q.get_failure(j.id), 30, what=f"job {job.data} to time out")
            assert failure.error.startswith("timeout:") and "400 ms" in failure.error, (job.data, failure)


@pytest.mark.parametrize("bad", [0, -1, 0.0, math.nan, math.inf, -math.inf, "1000", True, MAX_TIMEOUT_MS + 1, [5]])
def test_a_bad_timeout_is_a_config_error_naming_it(bad: object, shared_redis_url: str, queue_name: str) -> None:
    with pytest.raises(ConfigError, match="timeout_ms"):
        check_timeout_ms(bad)
    with SyncQueue(queue_name, redis_url=shared_redis_url) as q:
        with pytest.raises(ConfigError, match="timeout_ms"):
            q.add("a", 1, timeout_ms=bad)
        with pytest.raises(ConfigError, match="timeout_ms"):
            q.add_bulk([{"name": "a", "data": 1}, {"name": "a", "data": 2, "timeout_ms": bad}])
    with redis.Redis.from_url(shared_redis_url) as r:  # refused before anything was sent
        keys = QueueKeys.for_queue(queue_name)
        assert r.xlen(keys.stream) == 0 and not r.exists(keys.controls)
    with pytest.raises(ConfigError, match="timeout_ms"):
        handler("a", timeout_ms=bad)
    with pytest.raises(ConfigError, match="job_timeout_ms"):
        from airflow_provider_chasqui import WorkerSettings

        WorkerSettings(job_timeout_ms=bad)


def test_timeout_units_and_rules(shared_redis_url: str, queue_name: str) -> None:
    assert check_timeout_ms(0.2) == 1 and check_timeout_ms(1500.5) == 1501 and check_timeout_ms(MAX_TIMEOUT_MS) > 0
    with SyncQueue(queue_name, redis_url=shared_redis_url) as q:
        with pytest.raises(ConfigError, match="timeout_ms"):
            q.add("a", 1, timeout_ms=0, repeat=RepeatPattern.every(1000))
        with pytest.raises(ConfigError, match="timeout_ms"):
            q.upsert_repeatable_job("a", 1, repeat=RepeatPattern.every(1000), timeout_ms=float("inf"))
        with pytest.raises(ConfigError, match="timeout_ms"):
            q.upsert_repeatable_bulk(
                [{"name": "a", "data": 1, "repeat": RepeatPattern.every(1000), "timeout_ms": "1s"}]
            )
        assert q.get_repeatable_jobs() == []  # refused before anything was written
    # stored values the workers accept: exactly what the producers write
    assert parse_timeout(b"1000") == 1000
    for hostile in (b"", b"0", b"-5", b"1e3", b" 10", b"abc", b"\xff", b"99999999999999", None, 5, [b"1"]):
        assert parse_timeout(hostile) == 0, hostile


def test_a_handlers_timeout_survives_registration_and_binding() -> None:
    @handler("x", timeout_ms=250)
    def x(job, spark=None):
        return job

    reg = HandlerRegistry()

    @reg.handler("y", timeout_ms=1.5)
    def y(job, spark):
        return job

    reg.register("x", x)
    bound = bind(reg, {"spark": object()})
    assert getattr(bound["x"], TIMEOUT_ATTR) == 250 and getattr(bound["y"], TIMEOUT_ATTR) == 2


@pytest.mark.single_node("writes hostile values with a plain client")
async def test_hostile_stored_timeouts_run_the_job_without_one(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """The ``timeouts`` flag set, and each job's key holding junk (or another type): the jobs
    run to their end (0.3 s) without a timeout, nothing crashes or stalls."""
    keys = QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        jobs = [await q.add("h", i) for i in range(6)]
        await admin.hset(keys.controls, "timeouts", b"\xff")
        values = [b"abc", b"-1", b"0", b"99999999999999", b"1 "]
        for job, value in zip(jobs, values):
            await admin.set(keys.job_timeout(job.id), value)
        await admin.rpush(keys.job_timeout(jobs[-1].id), b"100")  # another type: MGET reads nil

        async def h(job):
            await asyncio.sleep(0.3)
            return job.data

        async with running(worker_factory(queue_name, h, redis_url, store_results=True)):
            assert [await j.wait_for_result(timeout=30) for j in jobs] == list(range(6))
    finally:
        await admin.aclose()


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_worker_process_stops_jobs_at_its_job_timeout(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """A worker process with ``job_timeout_ms=1000`` and a 60 s handler: every attempt of every
    job starts, is stopped within 2 s, and is retried until dead-lettered; no attempt ends."""
    url = matrix_url.url
    worker = spawn_worker(
        url,
        queue_name,
        tmp_path / "to.rec",
        "to-0",
        concurrency=4,
        handler_sleep_ms=60_000,
        job_timeout_ms=1000,
        store_results=1,
        starts=tmp_path / "to.starts",
    )
    try:
        with SyncQueue(queue_name, redis_url=url) as q:
            jobs = [q.add("t", {"i": i}, attempts=2, backoff=100) for i in range(4)]
            t0 = time.monotonic()
            for job in jobs:
                failure = wait_until_sync(lambda j=job: q.get_failure(j.id), 60, what="the job to be dead-lettered")
                assert failure.error.startswith("timeout:"), failure
            # two attempts of at most ~1 s each, plus a backoff of 0.1 s: far from the handler's 60 s
            assert time.monotonic() - t0 < 20
    finally:
        worker.stop()
    starts = [line.split() for line in (tmp_path / "to.starts").read_text().splitlines()]
    assert sorted((int(row[0]), int(row[4])) for row in starts) == sorted((i, a) for i in range(4) for a in (0, 1))
    assert read_records([tmp_path / "to.rec"]).counts == {}, "an attempt ran to its end"


async def test_a_spec_with_a_timeout_gives_every_fire_its_timeout(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """``upsert_repeatable_job(..., timeout_ms=800)``: each fire of an every-500 ms spec runs a
    60 s handler and fails with reason ``timeout`` within 2 s (attempts=1: dead-lettered).  The
    spec shows its timeout; ``add(repeat=..., timeout_ms=)`` and a bulk item keep theirs; the
    queue's first spec with a timeout waits once for the workers' controls cache."""
    q = queues(queue_name, redis_url)
    started: dict[str, float] = {}

    async def h(job):
        started[job.id] = time.time()  # wall clock, as the failure record's finished_ms
        await asyncio.sleep(60)

    t0 = time.monotonic()
    spec = await q.upsert_repeatable_job("slow", {"x": 1}, repeat=RepeatPattern.every(500), timeout_ms=800, attempts=1)
    first_upsert = time.monotonic() - t0
    t1 = time.monotonic()
    other = await q.add("slow", {"x": 2}, repeat=RepeatPattern.every(3_600_000), timeout_ms=1500)
    assert first_upsert >= 0.15 and time.monotonic() - t1 < first_upsert  # only the first one waits
    (bulk,) = await q.upsert_repeatable_bulk(
        [{"name": "slow", "data": 3, "repeat": RepeatPattern.every(7_200_000), "timeout_ms": 2500}]
    )
    assert [(await q.get_repeatable_job(k)).timeout_ms for k in (spec.id, other.id, bulk)] == [800, 1500, 2500]
    worker = worker_factory(queue_name, h, redis_url, run_scheduler=True, scheduler_tick_ms=100, store_results=True)
    async with running(worker):
        failures = []
        while len(failures) < 2:
            dlq = [row for row in await q.peek_dlq(100) if row["job_id"] in started]
            failures = [await q.get_failure(row["job_id"]) for row in dlq]
            failures = [f for f in failures if f is not None]
            await asyncio.sleep(0.05)
            assert time.monotonic() - t0 < 60, "no fire was stopped by its timeout"
        for f in failures[:2]:
            assert f.error.startswith("timeout:") and "800 ms" in f.error, f
            assert 0.7 < f.finished_ms / 1000 - started[f.job_id] < 2.0, f
    await q.remove_repeatable_by_key(spec.id)


def test_a_spec_ext_with_a_timeout_round_trips_and_a_hostile_one_is_refused() -> None:
    from airflow_provider_chasqui.core.scheduler import _skips_while_paused
    from airflow_provider_chasqui.core.spec_ext import SpecExt
    from airflow_provider_chasqui.errors import CodecError

    both = SpecExt(None, None, True, 900)
    assert SpecExt.decode(both.encode()) == both and _skips_while_paused(both.encode())
    only = SpecExt(timeout_ms=900)
    assert SpecExt.decode(only.encode()) == only and not _skips_while_paused(only.encode())
    assert SpecExt.decode(SpecExt(None, None, True).encode()).timeout_ms is None  # the four-item form stays
    import msgpack

    for hostile in ("900", 0, -1, 2**63, 1.5, True, [900]):
        with pytest.raises(CodecError, match="timeout_ms"):
            SpecExt.decode(msgpack.packb([1, None, None, 0, hostile]))


async def test_a_batch_all_cancelled_on_a_timed_queue_reads_no_timeouts(
    redis_url: str, queue_name: str, queues, worker_factory, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue whose jobs carry timeouts, a batch whose every job was cancelled while waiting:
    the worker settles them cancelled and reads no timeouts for an empty batch (it used to send
    an MGET with no key, and log that the timeouts cannot be read)."""
    q = queues(queue_name, redis_url)
    timed = await q.add("x", 1, timeout_ms=5000)
    doomed = await q.add("x", 2)
    assert await q.cancel(doomed.id) == "requested" and await q.cancel(timed.id) == "requested"
    seen: list[int] = []

    async def h(job):
        seen.append(job.data)

    with caplog.at_level("WARNING", logger="airflow_provider_chasqui"):
        async with running(worker_factory(queue_name, h, redis_url)):
            for job in (timed, doomed):
                await wait_until(lambda j=job: _state_is(q, j.id, "cancelled"), 30, what="the cancel")
    assert seen == []
    assert not [r for r in caplog.records if "cannot be read" in r.getMessage()], caplog.text


async def _state_is(q, job_id: str, state: str) -> bool:
    return await q.get_job_state(job_id) == state
