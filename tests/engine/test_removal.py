"""chasquimq's job maintenance (``core/removal.py``): ``Queue.remove`` / ``remove_report`` and
``clean`` in every state, with a real worker racing them, hostile keys and entries, bad
arguments, the sync twin, every server of the matrix and the cluster."""

from __future__ import annotations

import asyncio
import math

import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui import Job, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000
NOWHERE = {"delayed": False, "stream": False, "dlq": False, "result": False}


async def _dead(q, queue_name, redis_url, worker_factory, n: int) -> list[str]:
    """``n`` jobs dead-lettered by a worker that fails each once."""

    async def handler(job: Job) -> None:
        raise RuntimeError("intentional failure")

    ids = [(await q.add("f", {"n": i}, attempts=1)).id for i in range(n)]
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=1)):
        await wait_until(lambda: _at_least(q.get_failed_count(), n), what=f"{n} jobs in the DLQ")
    return ids


async def _has_progress(q, job_id: str) -> bool:
    job = await q.get_job(job_id)
    return job is not None and job.progress is not None


async def _at_least(count, n: int) -> bool:
    return await count >= n


async def test_remove_finds_a_job_wherever_it_waits(redis_url, queue_name, clients, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    waiting = await q.add("w", {"msg": "remove-me"})
    kept = await q.add("w", {"msg": "keep-me"})
    assert await q.remove(waiting.id) == 1
    assert await q.get_job_counts("waiting") == {"waiting": 1}
    assert [j.id for j in await q.get_jobs("waiting")] == [kept.id]
    assert await q.remove(waiting.id) == 0  # idempotent
    for own in ("Z" * 26, "0" * 26):  # ULID-shaped ids of the user's: from the future, from 1970
        await q.add("w", {"own": own}, job_id=own)
        assert await q.remove_report(own) == {**NOWHERE, "stream": True}, own
    assert await q.remove_report("does-not-exist") == NOWHERE

    delayed = await q.add("d", {"msg": "delayed"}, delay_ms=HOUR_MS, job_id="delayed-target")
    anonymous = await q.add("d", {"msg": "no id"}, delay_ms=HOUR_MS)  # no id index: found by a scan
    assert await q.remove_report(delayed.id) == {**NOWHERE, "delayed": True}
    assert await q.remove_report(anonymous.id) == {**NOWHERE, "delayed": True}
    assert await q.get_delayed_count() == 0
    again = await q.add("d", {"msg": "the id is free again"}, delay_ms=HOUR_MS, job_id="delayed-target")
    assert again.id == "delayed-target" and await q.get_delayed_count() == 1

    prioritized = await q.add("p", {"p": 1}, priority=3)
    assert await q.remove_report(prioritized.id) == {**NOWHERE, "stream": True}

    (dead,) = await _dead(q, queue_name, redis_url, worker_factory, 1)
    await clients(redis_url).set(QueueKeys.for_queue(queue_name).failure(dead), b"record")
    assert await q.remove_report(dead) == {**NOWHERE, "dlq": True, "result": True}
    assert await q.get_failed_count() == 0


@pytest.mark.parametrize("own", ["a*[b]?\\c", "tab\there\x00", "ñandú ✓", "x" * 300])
async def test_hostile_ids_remove_only_their_own_job(redis_url, queue_name, queues, own) -> None:
    """Glob characters, control bytes, non-ASCII and long ids: found by their exact id, and a
    look-alike (the id's glob would match it) is left."""
    q = queues(queue_name, redis_url)
    await q.add("d", {}, delay_ms=HOUR_MS, job_id=own)
    await q.add("w", {}, job_id=own + "w")
    look_alike = await q.add("d", {}, delay_ms=HOUR_MS, job_id="a-b-c" if "*" in own else own + "-2")
    assert await q.remove_report(own) == {**NOWHERE, "delayed": True}
    assert await q.remove_report(own + "w") == {**NOWHERE, "stream": True}
    assert [j.id for j in await q.get_jobs("delayed")] == [look_alike.id]


async def test_a_running_job_is_never_removed(redis_url, queue_name, clients, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    k, r = QueueKeys.for_queue(queue_name), clients(redis_url)
    release, runs = asyncio.Event(), []

    async def handler(job: Job) -> str:
        await job.update_progress(30)
        await job.log("working")
        runs.append(job.id)
        await release.wait()
        return "done"

    job = await q.add("slow", {})
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=1, store_results=True)):
        await wait_until(lambda: runs, what="the job running")
        await wait_until(lambda: _has_progress(q, job.id), what="the progress written")
        assert await q.remove_report(job.id) == NOWHERE
        assert await q.clean(0, 0, "waiting") == []
        assert (await q.get_job(job.id)).progress == 30  # its records stay too
        assert await q.get_job_logs(job.id) == (["working"], 1)
        release.set()
        assert await q.wait_for_result(job.id, timeout=30) == "done"
    assert runs == [job.id]
    assert await q.clean(0, 0, "completed") == [job.id]
    assert await r.exists(k.result(job.id), k.progress(job.id), k.logs(job.id)) == 0 and await r.zcard(k.results) == 0
    assert await q.remove_report(job.id) == NOWHERE


async def test_clean_by_state_age_and_limit(redis_url, queue_name, clients, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)
    k, r = QueueKeys.for_queue(queue_name), clients(redis_url)
    ids = [(await q.add("w", {"n": i})).id for i in range(8)]
    assert await q.clean(HOUR_MS, 100, "waiting") == []  # all younger than the grace
    assert await q.clean(0, 3, "waiting") == ids[:3]  # oldest first, the limit caps
    assert await q.get_waiting_count() == 5
    assert await q.clean(0, 0, "waiting") == ids[3:]  # 0: no limit
    later = [(await q.add("d", {"n": i}, delay_ms=HOUR_MS * (3 - i))).id for i in range(3)]
    assert await q.clean(HOUR_MS, 0, "delayed") == []
    assert await q.clean(0, 2, "delayed") == [later[2], later[1]]  # soonest due first
    assert await q.clean(0, 100, "delayed") == [later[0]]
    dead = await _dead(q, queue_name, redis_url, worker_factory, 3)
    assert await q.clean(HOUR_MS, 100, "failed") == []
    for jid in dead:  # their failure records, as a worker keeps them, go with them
        await r.set(k.failure(jid), b"record")
        await r.zadd(k.failures, {jid: 1})
    assert await q.clean(0, 100, "failed") == dead
    assert await r.exists(*(k.failure(jid) for jid in dead)) == 0 and await r.zcard(k.failures) == 0
    assert await q.get_job_counts("waiting", "delayed", "failed") == {"waiting": 0, "delayed": 0, "failed": 0}
    assert await q.clean(0, 100, "completed") == []  # no results were stored


async def test_clean_and_remove_race_a_worker_without_losing_or_repeating_a_job(
    redis_url, queue_name, queues, worker_factory
) -> None:
    """While a worker drains the queue, clean and remove delete what they can: every job is
    either run once or reported removed, never both, never neither."""
    q = queues(queue_name, redis_url)
    runs: list[str] = []

    async def handler(job: Job) -> None:
        runs.append(job.id)
        await asyncio.sleep(0.002)

    ids = [j.id for j in await q.add_bulk([{"name": "r", "data": {"i": i}} for i in range(600)])]
    removed: list[str] = []
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=8)):
        for i in range(0, 300, 25):
            removed += await q.clean(0, 20, "waiting")
            removed += [jid for jid in ids[600 - i - 5 : 600 - i] if await q.remove(jid)]
        await wait_until(lambda: len(runs) + len(removed) >= 600, what="every job run or removed")
    assert removed, "the race removed nothing: it proved nothing"
    assert len(runs) == len(set(runs)), "a job ran twice"
    assert set(runs).isdisjoint(removed), "a job reported removed ran"
    assert sorted(runs + removed) == sorted(ids)
    assert await q.count() == 0


async def test_hostile_keys_and_entries_are_no_jobs(redis_url, queue_name, clients, queues) -> None:
    q = queues(queue_name, redis_url)
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    job = await q.add("w", {})
    await r.xadd(k.stream, {"d": b"\xc1not an envelope", "n": b"w"})
    await r.xadd(k.dlq, {"x": b"no d at all"})
    assert await q.clean(0, 0, "waiting") == [job.id]  # the entry holding no job stays
    assert await q.clean(0, 0, "failed") == []
    assert await r.xlen(k.stream) == 1 and await r.xlen(k.dlq) == 1
    for key in (k.stream, k.dlq, k.delayed, k.prioritized, k.results):
        await r.delete(key)
        await r.set(key, b"a string where a stream or a set belongs")
    assert await q.remove_report("any") == NOWHERE
    for state in ("waiting", "delayed", "failed", "completed"):
        assert await q.clean(0, 0, state) == []


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((-1, 10, "waiting"), ValueError, "grace_ms"),
        ((math.nan, 10, "waiting"), TypeError, "grace_ms"),
        ((True, 10, "waiting"), TypeError, "grace_ms"),
        ((0, -1, "waiting"), ValueError, "limit"),
        ((0, 1.5, "waiting"), TypeError, "limit"),
        ((0, 10, "active"), ValueError, "cannot clean state 'active'"),
        ((0, 10, 3), TypeError, "state must be a str"),
    ],
)
async def test_bad_clean_arguments_are_named(redis_url, queue_name, queues, args, error, words) -> None:
    with pytest.raises(error, match=words):
        await queues(queue_name, redis_url).clean(*args)


async def test_bad_job_ids_are_named(redis_url, queue_name, queues) -> None:
    q = queues(queue_name, redis_url)
    for bad, error in (("", ValueError), (5, TypeError), (None, TypeError), ("x" * 5000, ValueError)):
        with pytest.raises(error, match="job_id"):
            await q.remove(bad)  # type: ignore[arg-type]


def test_the_sync_twin_answers_alike(redis_url, queue_name) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        jobs = [q.add("w", {"n": i}) for i in range(3)]
        delayed = q.add("d", {}, delay_ms=HOUR_MS)
        assert q.remove(jobs[0].id) == 1
        assert q.remove_report(delayed.id) == {**NOWHERE, "delayed": True}
        assert q.clean(0, 0, "waiting") == [jobs[1].id, jobs[2].id]
        assert q.count() == 0


async def test_remove_and_clean_on_every_server(matrix_url, queue_name, queues) -> None:
    q = queues(queue_name, matrix_url.url, fast_paths=not matrix_url.force_compat)
    ids = [(await q.add("w", {"n": i})).id for i in range(3)]
    await q.add("d", {}, delay_ms=HOUR_MS)
    assert await q.remove(ids[1]) == 1
    assert await q.clean(0, 0, "waiting") == [ids[0], ids[2]]
    assert len(await q.clean(0, 0, "delayed")) == 1
    assert await q.count() == 0
