"""A job's ``active`` event comes before its outcome (issue 27).

The worker sends a batch's ``active`` events without waiting for them and hands the jobs to
its slots at once (``Worker._admit``); the events are written before any slot runs, and
whatever writes an outcome waits for the events in flight first (``Worker._emitted``).
Handlers here never suspend and acks go one at a time, the shape in which an outcome would
most easily overtake its ``active`` event; the events stream must still show, for every job,
each ``completed``, ``failed`` or ``cancelled`` after an ``active`` of its own.  The server
matrix: Redis 7.0, Valkey 8.1, Redis 8.2 (XACKDEL), and a cluster (no pinned connection).
"""

from __future__ import annotations

import collections

import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)

OUTCOMES = (b"completed", b"failed", b"cancelled")


async def _events(r, queue: str) -> list[tuple[bytes, str]]:
    rows = await r.xrange(QueueKeys.for_queue(queue).events, "-", "+")
    return [(f[b"e"], f.get(b"id", b"").decode()) for _eid, f in rows]


async def test_no_outcome_event_precedes_its_active_event(
    matrix_url, queue_name: str, queues, worker_factory, clients
) -> None:
    url = matrix_url.url
    q = queues(queue_name, url, fast_paths=not matrix_url.force_compat)
    jobs = [{"name": "ok", "data": {"k": "ok", "i": i}} for i in range(300)]
    jobs += [{"name": "dead", "data": {"k": "dead", "i": i}, "attempts": 1} for i in range(150)]
    jobs += [{"name": "again", "data": {"k": "again", "i": i}, "attempts": 2, "backoff": 0} for i in range(150)]
    await q.add_bulk(jobs)

    async def handler(job):  # never suspends: the outcome is ready before any reply arrives
        if job.data["k"] == "dead" or (job.data["k"] == "again" and job.attempt == 0):
            raise ValueError(job.data["k"])
        return None

    r = clients(url)
    w = worker_factory(queue_name, handler, url, concurrency=20, ack_batch=1, fast_paths=not matrix_url.force_compat)
    async with running(w):

        async def settled() -> bool:
            kinds = collections.Counter(k for k, _ in await _events(r, queue_name))
            return kinds[b"completed"] == 450 and kinds[b"dlq"] == 150

        await wait_until(settled, 60, what="450 completed and 150 dead-lettered jobs")
    actives: collections.Counter[str] = collections.Counter()
    outcomes: collections.Counter[str] = collections.Counter()
    for kind, job_id in await _events(r, queue_name):
        if kind == b"active":
            actives[job_id] += 1
        elif kind in OUTCOMES:
            outcomes[job_id] += 1
            assert outcomes[job_id] <= actives[job_id], f"job {job_id}: {kind!r} before its active event"
    assert sum(actives.values()) == 750 and sum(outcomes.values()) == 750  # 600 first runs, 150 retries
