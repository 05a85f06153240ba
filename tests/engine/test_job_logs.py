"""A job's log lines (``job.log``, ``Queue.get_job_logs``, ``chasqui job show``) and its progress
read back (``Job.progress``): handlers on the loop, in threads and in a process pool, retries
appending, the newest 1000 lines kept a day, slices and clamps, bad lines and arguments, and a
log key of another type."""

from __future__ import annotations

import asyncio

import pool_handlers
import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui import Job, SyncQueue
from airflow_provider_chasqui.core.job_logs import LOG_TTL_MS, MAX_LOG_LINE, MAX_LOG_LINES
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)


async def _settled(q) -> bool:
    return await q.count() == 0


async def test_lines_of_every_attempt_are_kept_in_order_and_sliced(
    redis_url, queue_name, queues, worker_factory, clients
) -> None:
    q = queues(queue_name, redis_url)
    r, k = clients(redis_url), QueueKeys.for_queue(queue_name)

    async def handler(job: Job) -> None:
        for i in range(3):
            await job.log(f"attempt {job.attempt} line {i}")
        if job.attempt == 0:
            raise ValueError("again")

    job = await q.add("x", {}, attempts=2, backoff=1)
    async with running(worker_factory(queue_name, handler, redis_url)):
        # its end, not count() == 0: a count can miss a job moving from the delayed set to the
        # stream between its reads (core/listing.py)
        assert await job.wait_for_result(timeout=30) is None
    every = [f"attempt {a} line {i}" for a in (0, 1) for i in range(3)]
    assert await q.get_job_logs(job.id) == (every, 6)
    assert await q.get_job_logs(job.id, 2, 4) == (every[2:5], 6)
    assert await q.get_job_logs(job.id, 0, 1, asc=False) == ([every[5], every[4]], 6)
    assert await q.get_job_logs(job.id, -2) == (every[-2:], 6)
    assert await q.get_job_logs(job.id, 0, 10_000) == (every, 6)
    assert await q.get_job_logs(job.id, 50, 60) == ([], 6)
    assert await q.get_job_logs("no-such-job") == ([], 0)
    assert LOG_TTL_MS - 60_000 < await r.pttl(k.logs(job.id)) <= LOG_TTL_MS
    details = await q.get_job_details(job.id)
    assert (details.logs, details.log_lines) == (every, 6)


async def test_plain_and_pooled_handlers_log_and_only_the_newest_lines_are_kept(
    redis_url, queue_name, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)

    def handler(job: Job) -> None:  # in a thread
        for i in range(MAX_LOG_LINES + 100):
            job.log_sync(f"L{i}")

    many = await q.add("x", {})
    async with running(worker_factory(queue_name, handler, redis_url)):
        await wait_until(lambda: _settled(q), what="the job done")
    lines, count = await q.get_job_logs(many.id)
    assert count == MAX_LOG_LINES and lines[0] == "L100" and lines[-1] == f"L{MAX_LOG_LINES + 99}"
    pooled = await q.add("write_log", 3)
    async with running(worker_factory(queue_name, pool_handlers.HANDLERS, redis_url, processes=1)):
        await wait_until(lambda: _settled(q), what="the pooled job done")
    assert await q.get_job_logs(pooled.id) == (["pooled 0", "pooled 1", "pooled 2", "refused: bytes"], 4)


async def test_bad_lines_and_ended_attempts_are_refused(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    said: list[str] = []
    kept: list[Job] = []

    async def handler(job: Job) -> None:
        for bad in (None, 3, b"x", "x" * (MAX_LOG_LINE + 1), "\ud800"):
            try:
                await job.log(bad)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                said.append(f"{type(exc).__name__}: {exc}")
        await job.log("x" * MAX_LOG_LINE)  # the longest line allowed
        kept.append(job)

    job = await q.add("x", {})
    async with running(worker_factory(queue_name, handler, redis_url)):
        await wait_until(lambda: _settled(q), what="the job done")
    assert [s.split(":")[0] for s in said] == ["ConfigTypeError"] * 3 + ["ConfigError"] * 2
    assert "16,384 characters" in said[3] and "UTF-8" in said[4]
    with pytest.raises(RuntimeError, match="attempt .* ended"):
        await kept[0].log("late")
    assert await q.get_job_logs(job.id) == (["x" * MAX_LOG_LINE], 1)
    read_only = await q.get_job(job.id)
    with pytest.raises(RuntimeError, match="read-only"):
        await read_only.log("nope")
    with pytest.raises(RuntimeError, match="read-only"):
        await (await q.add("y", {})).update_progress(5)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (("j", "0"), TypeError, "start must be an int"),
        (("j", 0, 1.5), TypeError, "end must be an int"),
        (("j", 0, -1, "yes"), TypeError, "asc must be a bool"),
        (("j", True), TypeError, "start must be an int"),
        (("j", 2**63), ValueError, "start must be from"),
        (("",), ValueError, "job"),
    ],
)
def test_bad_log_reads_are_named(redis_url, queue_name, args, error, words) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q, pytest.raises(error, match=words):
        q.get_job_logs(*args)


async def test_a_log_key_of_another_type_reads_as_none_and_never_stops_a_worker(
    redis_url, queue_name, queues, worker_factory, clients
) -> None:
    q = queues(queue_name, redis_url)
    r, k = clients(redis_url), QueueKeys.for_queue(queue_name)
    job = await q.add("x", {}, job_id="hostile-log")
    await r.set(k.logs("hostile-log"), "not a list")
    ran: list[str] = []

    async def handler(j: Job) -> str:
        await j.log("lost")  # its write fails (WRONGTYPE): logged, the job goes on
        await j.update_progress(10)
        ran.append(j.id)
        return "ok"

    async with running(worker_factory(queue_name, handler, redis_url, store_results=True)):
        assert await job.wait_for_result(timeout=20) == "ok"
    assert ran == [job.id]
    assert await q.get_job_logs(job.id) == ([], 0)
    details = await q.get_job_details(job.id)
    assert details.logs == [] and any("logs" in n for n in details.notes)
    assert details.progress == 10  # written in the same pipeline as the refused line


async def test_progress_is_read_back_with_the_job_while_it_runs(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        await job.update_progress({"stage": "load", "pct": 40})
        await release.wait()

    job = await q.add("x", {"n": 1})
    async with running(worker_factory(queue_name, handler, redis_url)):
        try:
            got = await wait_until(lambda: _progress_of(q, job.id), what="the progress read back")
            assert got == {"stage": "load", "pct": 40}
            (active,) = await q.get_jobs("active")
            assert (active.id, active.progress, active.data) == (job.id, {"stage": "load", "pct": 40}, {"n": 1})
            assert (await q.get_jobs("waiting")) == []
        finally:
            release.set()
        await wait_until(lambda: _settled(q), what="the job done")


async def _progress_of(q, job_id: str) -> object:
    job = await q.get_job(job_id)
    return None if job is None else job.progress
