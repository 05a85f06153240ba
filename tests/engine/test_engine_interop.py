"""Interop with the real thing: the ``chasquimq`` 1.3.0 wheel (Rust engine via PyO3) as producer.

Its immediate adds need Redis 8.6 (``XADD ... IDMP``); its delayed adds are plain ZADDs (or the
idempotent-schedule script with a job id), which work on Redis 7.  What it writes must decode
here byte for byte, re-encode to the same bytes, and run on our worker with the right id,
name and data.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
from engine_support import kv, running, wait_until

from airflow_provider_chasqui import Job
from airflow_provider_chasqui.core.codec import decode_envelope, encode_envelope, encode_member, split_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.types import build_retry_override

# chasquimq 1.3.0 has no Redis Cluster client (on a cluster its commands fail with MOVED):
# interop is tested on the single shared server only.
pytestmark = [pytest.mark.interop, pytest.mark.single_node("the chasquimq wheel cannot talk to a Redis Cluster")]

DATA = {"to": "ada@example.com", "n": [1, 2.5, None, True], "blob": b"\x00\xff"}


async def _members(r, k: QueueKeys) -> dict[str, tuple[str, bytes, float]]:
    """job id -> (name, member bytes, score) of the delayed set."""
    out = {}
    for member, score in await r.zrange(k.delayed, 0, -1, withscores=True):
        name, env = split_member(member)
        out[decode_envelope(env).id] = (name, member, score)
    return out


async def test_chasquimq_delayed_adds_run_on_our_worker(
    chasquimq, redis_url, queue_name, clients, worker_factory
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    before = int(time.time() * 1000)
    try:
        named = await cq.add("send-email", DATA, delay_ms=400)
        unnamed = await cq.add("", [1, "two"], delay=timedelta(milliseconds=400))
        with_retry = await cq.add(
            "retrying",
            {"r": 1},
            delay_ms=400,
            attempts=3,
            backoff=chasquimq.BackoffSpec.exponential(250, multiplier=3.0, max_ms=10_000, jitter_ms=50),
        )
        with_int_backoff = await cq.add("int-backoff", 5, delay_ms=400, backoff=500)
        at = await cq.add("absolute", "at", delay_ms=datetime.now(UTC) + timedelta(milliseconds=400))
        with_id = await cq.add("by-id", {"id": 1}, delay_ms=400, job_id="cq-fixed-id")
    finally:
        await cq.close()
    after = int(time.time() * 1000)

    members = await _members(r, k)
    assert set(members) == {named.id, unnamed.id, with_retry.id, with_int_backoff.id, at.id, "cq-fixed-id"}
    assert with_id.id == "cq-fixed-id"
    # the caller id went through the idempotent-schedule script: its marker and index exist
    assert await r.get(k.dlid("cq-fixed-id")) == b"1"
    assert await r.get(k.didx("cq-fixed-id")) == members["cq-fixed-id"][1]
    # byte for byte: what chasquimq wrote is what we would write for the same id and clock
    options = {
        named.id: ("send-email", DATA, None, None),
        unnamed.id: ("", [1, "two"], None, None),
        with_retry.id: (
            "retrying",
            {"r": 1},
            3,
            {"kind": "exponential", "delay_ms": 250, "max_delay_ms": 10_000, "multiplier": 3.0, "jitter_ms": 50},
        ),
        with_int_backoff.id: ("int-backoff", 5, None, 500),
        at.id: ("absolute", "at", None, None),
        "cq-fixed-id": ("by-id", {"id": 1}, None, None),
    }
    core = ProducerCore(queue_name)
    for job_id, (name, member, score) in members.items():
        want_name, data, attempts, backoff = options[job_id]
        assert name == want_name  # chasquimq 1.3.0 keeps the name of a delayed add in the prefix
        _name, env_bytes = split_member(member)
        env = decode_envelope(env_bytes)
        assert (env.id, env.attempt) == (job_id, 0)
        assert before - 5 <= env.created_at_ms <= after + 5
        assert msgpack.unpackb(env.inner, raw=False) == data
        assert encode_envelope(env) == env_bytes
        ours = core.prepare(
            name,
            data,
            delay_ms=score - env.created_at_ms,
            job_id=job_id,
            now=env.created_at_ms,
            retry=build_retry_override(attempts, backoff),
        )
        assert ours.envelope == env_bytes, job_id
        assert encode_member(name.encode(), ours.envelope) == member
        assert 300 <= score - env.created_at_ms <= 500

    seen: dict[str, Job] = {}

    async def handler(job: Job) -> None:
        seen[job.id] = job

    async with running(worker_factory(queue_name, handler, redis_url, promoter_poll_ms=20)):
        await wait_until(lambda: len(seen) == 6, what="all chasquimq jobs consumed")
    for job_id, (name, data, _a, _b) in options.items():
        job = seen[job_id]
        assert (job.id, job.name, job.data, job.attempt) == (job_id, name, data, 0)
    assert seen[with_retry.id].name == "retrying"
    assert await r.zcard(k.delayed) == 0 and await r.xlen(k.stream) == 0


async def test_our_cancel_and_dedup_work_on_chasquimq_scheduled_ids(
    chasquimq, redis_url, queue_name, clients, queues
) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        await cq.add("x", 1, delay_ms=60_000, job_id="shared-id")
    finally:
        await cq.close()
    q = queues(queue_name, redis_url)
    again = await q.add("x", 2, delay_ms=60_000, job_id="shared-id")  # suppressed by chasquimq's marker
    assert again.id == "shared-id" and await r.zcard(k.delayed) == 1
    assert await q.get_job_state("shared-id") == "delayed"
    assert await q.cancel_delayed("shared-id") is True
    assert await r.zcard(k.delayed) == 0


async def test_chasquimq_reads_our_dlq_shape(chasquimq, redis_url, queue_name, clients, queues) -> None:
    """chasquimq's peek_dlq parses DLQ entries we wrote (fields d, n, source_id, reason, detail)."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    job = await q.add("dead", {"x": 1})
    env = (await r.xrange(k.stream))[0][1][b"d"]
    await r.xadd(k.dlq, {"d": env, "n": "dead", "source_id": "1-0", "reason": "retries_exhausted"})
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        (entry,) = await cq.peek_dlq(10)
    finally:
        await cq.close()
    assert entry["reason"] == "retries_exhausted" and entry["source_id"] == "1-0" and entry["name"] == "dead"
    assert bytes(entry["payload"]) == env
    assert decode_envelope(env).id == job.id


async def test_chasquimq_reads_a_dlq_entry_carrying_our_traceback(
    chasquimq, redis_url, queue_name, clients, queues, worker_factory
) -> None:
    """Our worker puts a failed handler's traceback in the DLQ's optional ``detail`` field (the
    only field it adds to what ChasquiMQ writes): chasquimq's peek_dlq reads the entry, with the
    traceback as its detail and every other field as ChasquiMQ would have written it."""
    k = QueueKeys.for_queue(queue_name)
    r = clients(redis_url)
    q = queues(queue_name, redis_url)
    job = await q.add("dead", {"x": 1}, attempts=1)

    async def handler(job: Job) -> None:
        raise ValueError("boom")

    async with running(worker_factory(queue_name, handler, redis_url, run_scheduler=False)):
        await wait_until(lambda: r.xlen(k.dlq), what="the job to be dead-lettered")
    ((_id, fields),) = await r.xrange(k.dlq)
    assert [f for f, _v in kv(fields)] == ["d", "n", "source_id", "reason", "detail"]  # ChasquiMQ's order
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        (entry,) = await cq.peek_dlq(10)
    finally:
        await cq.close()
    assert entry["reason"] == "retries_exhausted" and entry["name"] == "dead"
    assert entry["detail"].startswith("Traceback (most recent call last):")
    assert entry["detail"].rstrip().endswith("ValueError: boom")
    assert decode_envelope(bytes(entry["payload"])).id == job.id


@pytest.mark.parametrize("delay_kw", [{"delay_ms": 0}, {}], ids=["zero-delay", "no-delay"])
async def test_chasquimq_immediate_adds_need_redis_86(chasquimq, redis_url, queue_name, delay_kw) -> None:
    """The reason only delayed adds interoperate on Redis 7: chasquimq's XADD uses IDMP."""
    cq = chasquimq.Queue(queue_name, redis_url=redis_url)
    try:
        with pytest.raises(RuntimeError, match="(?i)invalid stream id|syntax|IDMP"):
            await cq.add("now", 1, **delay_kw)
    finally:
        await cq.close()
