"""Batch handlers (issue 25): a handler declared with a batch size receives a list of up to
that many jobs of its name and returns one result (or exception) per job; each job is settled
on its own.  Real servers and in-process workers."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import events_of, running, wait_until

from airflow_provider_chasqui import ConfigError, RateLimited
from airflow_provider_chasqui.core.running import BATCH_ATTR, check_batch
from airflow_provider_chasqui.worker.registry import handler

pytestmark = pytest.mark.timeout(120)


async def test_a_batch_of_100_with_one_failing_job_settles_99_and_retries_1(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    q = queues(queue_name, redis_url)
    calls: list[list[int]] = []

    @handler("resize", batch=100)
    async def resize(jobs):
        calls.append([j.data["i"] for j in jobs])
        return [ValueError("corrupt image") if j.data["i"] == 37 and j.attempt == 0 else j.data["i"] * 2 for j in jobs]

    jobs = await q.add_bulk([{"name": "resize", "data": {"i": i}, "backoff": 50} for i in range(100)])
    async with running(worker_factory(queue_name, {"resize": resize}, redis_url, store_results=True)):
        results = await asyncio.gather(*(j.wait_for_result(timeout=60) for j in jobs))
    assert results == [i * 2 for i in range(100)]
    assert all(len(c) <= 100 for c in calls) and sorted(i for c in calls for i in c) == sorted([*range(100), 37])
    assert len(calls) <= 10  # batched, not one call per job
    events = await events_of(clients(redis_url), queue_name)
    by_kind: dict[str, list[str]] = {}
    for e in events:
        by_kind.setdefault(e["e"], []).append(e["id"])
    target = jobs[37].id
    assert by_kind["failed"] == [target] and by_kind["retry-scheduled"] == [target]
    assert len(by_kind["completed"]) == 100 and "dlq" not in by_kind


async def test_a_raising_or_misshapen_batch_fails_every_job_of_its_call(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)

    async def boom(jobs):
        raise RuntimeError(f"down for {len(jobs)}")

    def short(jobs):  # a plain function, in a thread
        return [1]

    setattr(boom, BATCH_ATTR, 10)
    setattr(short, BATCH_ATTR, 10)
    async with running(worker_factory(queue_name, {"boom": boom, "short": short}, redis_url, store_results=True)):
        a = await q.add_bulk([{"name": "boom", "data": i, "attempts": 1} for i in range(3)])
        b = await q.add_bulk([{"name": "short", "data": i, "attempts": 1} for i in range(3)])
        for job in a + b:
            await wait_until(lambda j=job: q.get_failure(j.id), 30, what=f"{job.name} {job.data} to fail")
        fa = [await q.get_failure(j.id) for j in a]
        fb = [await q.get_failure(j.id) for j in b]
    assert all("RuntimeError" in f.error and "down for" in f.error for f in fa)
    assert all(f.reason == "unrecoverable" and "expected a list of" in f.error for f in fb)


async def test_a_rate_limited_batch_goes_back_whole_counting_no_attempt(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """``RateLimited`` raised by a batch handler failed every job of the call (an attempt each,
    retried through the delayed set or dead-lettered with ``attempts=1``); as for a single job,
    every job of the call now goes back with no attempt counted and the queue waits.  One
    job's ``RateLimited`` in the reply sends back that job alone."""
    q = queues(queue_name, redis_url)
    calls: list[tuple[float, list[int]]] = []

    async def limited(jobs):
        calls.append((asyncio.get_running_loop().time(), [j.data for j in jobs]))
        if len(calls) == 1:
            raise RateLimited(300)
        return [RateLimited(50) if j.data == 3 and j.attempt == 0 and len(calls) == 2 else j.data for j in jobs]

    setattr(limited, BATCH_ATTR, 10)
    jobs = await q.add_bulk([{"name": "limited", "data": i, "attempts": 1} for i in range(6)])
    async with running(worker_factory(queue_name, {"limited": limited}, redis_url, store_results=True)):
        outcomes = await q.wait_for_results([j.id for j in jobs], timeout=30)
    assert {j.data: outcomes[j.id].value for j in jobs} == {i: i for i in range(6)}, outcomes
    assert calls[1][0] - calls[0][0] >= 0.29  # the queue waited out the batch's retry_after
    kinds = {e["e"] for e in await events_of(clients(redis_url), queue_name)}
    assert not kinds & {"failed", "retry-scheduled", "dlq"}, kinds


async def test_other_jobs_run_beside_batches_in_order(redis_url: str, queue_name: str, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    seen: list[str] = []

    @handler("b", batch=5)
    def batched(jobs):
        seen.extend(f"b{j.data}" for j in jobs)
        return [j.data for j in jobs]

    async def single(job):
        seen.append(f"s{job.data}")
        return job.data

    items = [{"name": "b" if i % 2 else "s", "data": i} for i in range(20)]
    async with running(worker_factory(queue_name, {"b": batched, "s": single}, redis_url, store_results=True)):
        jobs = await q.add_bulk(items)
        assert [await j.wait_for_result(timeout=60) for j in jobs] == list(range(20))
    assert sorted(seen) == sorted(f"{'b' if i % 2 else 's'}{i}" for i in range(20))
    singles = [s for s in seen if s[0] == "s"]
    assert singles == sorted(singles, key=lambda s: int(s[1:]))  # the single jobs kept their order


@pytest.mark.parametrize("bad", [0, -1, 10_001, 1.5, True, "5", None])
def test_a_bad_batch_size_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="batch"):
        check_batch(bad)
    if bad is not None:
        with pytest.raises(ConfigError, match="batch"):
            handler("x", batch=bad)  # type: ignore[arg-type]
