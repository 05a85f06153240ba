"""The trace context field ``tp`` against the real ``chasquimq`` wheel (marker ``interop``:
``scripts/matrix.sh interop`` runs these in the venv that has it).

ChasquiMQ's readers locate entry fields by name and ignore unknown ones (wire spec 3.1).  On
Redis 7 its DLQ reader shows that: an entry carrying ``tp`` next to ``d``/``n`` is read and
replayed intact.  Its stream consumer needs Redis 8.6 (XREADGROUP CLAIM, XACKDEL): on such a
server a traced add of ours runs on a chasquimq ``Worker``; elsewhere that test is skipped.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from engine_support import running, stream_entries, wait_until

from airflow_provider_chasqui.core.codec import decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.producer import ProducerCore

pytestmark = [pytest.mark.interop, pytest.mark.single_node("the chasquimq wheel cannot talk to a Redis Cluster")]

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_chasquimq_reads_and_replays_an_entry_with_a_trace_field(
    chasquimq, redis_url, queue_name, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    job = ProducerCore(queue_name).prepare("traced", {"a": 1})
    with redis.Redis.from_url(redis_url) as r:
        # the DLQ row our worker would write, plus the field a traced producer adds
        r.xadd(k.dlq, {"d": job.envelope, "n": b"traced", "tp": TP, "source_id": "1-0", "reason": "retries_exhausted"})
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        (entry,) = await cq.peek_dlq(10)
        assert entry["name"] == "traced" and entry["reason"] == "retries_exhausted"
        assert bytes(entry["payload"]) == job.envelope
        assert await cq.replay_dlq(10) == 1
    finally:
        await cq.close()
    ((_, fields),) = stream_entries(redis_url, queue_name)
    assert decode_envelope(fields["d"]).id == job.id and fields["n"] == b"traced"
    seen = []
    async with running(worker_factory(queue_name, lambda j: seen.append((j.id, j.name, j.data)), redis_url)):
        await wait_until(lambda: seen, what="the replayed job")
    assert seen == [(job.id, "traced", {"a": 1})]


def _version(url: str) -> tuple[int, ...]:
    with redis.Redis.from_url(url) as r:
        return tuple(int(p) for p in str(r.info("server")["redis_version"]).split(".")[:2])


async def test_chasquimq_worker_runs_a_traced_add(chasquimq, redis_url, queue_name, queues) -> None:
    if _version(redis_url) < (8, 6):
        pytest.skip("chasquimq's consumer needs Redis 8.6 (XREADGROUP CLAIM, XACKDEL)")
    q = queues(queue_name, redis_url, tracing=True)
    job = await q.add("traced", {"a": 2})
    ((_, fields),) = stream_entries(redis_url, queue_name)
    assert set(fields) == {"d", "n", "tp"}
    seen = []

    async def handler(j):
        seen.append((j.id, j.name, j.data))

    worker = chasquimq.Worker(queue_name, handler, redis_url=redis_url, run_scheduler=False)
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: seen, timeout=30, what="chasquimq ran the traced job")
    finally:
        await worker.close()
        await asyncio.wait_for(task, 30)
    assert seen == [(job.id, "traced", {"a": 2})]
