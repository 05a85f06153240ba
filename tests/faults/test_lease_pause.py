"""Lease lost: a worker process paused (SIGSTOP) with a job running loses its lease, another
worker takes the job over after ``claim_min_idle_ms`` and completes it exactly once, and the
paused worker, resumed (SIGCONT) while the new owner still runs the job, finishes its own
run but does not ack the entry the other worker holds nor record a second completion."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from engine_support import events_of, pending_count, raw_async, running, wait_until
from fault_support import count_lines, spawn_worker

from airflow_provider_chasqui import Job, Worker
from airflow_provider_chasqui.core.keys import QueueKeys


async def _owners(r, stream: str) -> list[tuple[bytes, str]]:
    rows = await r.xpending_range(stream, "default", "-", "+", 10)
    return [(row["message_id"], row["consumer"].decode()) for row in rows]


@pytest.mark.timeout(90)
async def test_a_paused_workers_job_is_taken_over_and_completed_once(redis_url, queue_name, tmp_path) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = raw_async(redis_url)
    await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    a = spawn_worker(
        redis_url,
        queue_name,
        tmp_path / "a.rec",
        "lease-a",
        concurrency=1,
        claim_min_idle_ms=1000,
        handler_sleep_ms=4000,
    )
    b_started, b_done = asyncio.Event(), asyncio.Event()

    async def b_handler(job: Job) -> None:
        b_started.set()
        await asyncio.sleep(6)
        b_done.set()

    stopped = False
    try:
        await r.xadd(k.stream, {"d": _envelope(), "n": "pause"})
        ((entry, owner),) = await wait_until(lambda: _owners(r, k.stream), 30, what="worker A to take the job")
        assert owner == "lease-a"
        os.kill(a.pid, signal.SIGSTOP)
        stopped = True
        b = Worker(
            queue_name,
            b_handler,
            redis_url=redis_url,
            consumer_id="lease-b",
            claim_min_idle_ms=1000,
            run_scheduler=False,
            read_block_ms=1000,
        )
        async with running(b):
            await asyncio.wait_for(b_started.wait(), 20)  # B reclaimed it once A's lease lapsed
            os.kill(a.pid, signal.SIGCONT)
            stopped = False
            # A's handler (4 s of wall time, mostly spent stopped) ends while B still runs the job
            await wait_until(lambda: count_lines(a.out) == 1, 10, what="worker A's run to end")
            assert not b_done.is_set(), "B finished first: the check below would prove nothing"
            assert await _owners(r, k.stream) == [(entry, "lease-b")], "A acked the entry B is running"
            await asyncio.wait_for(b_done.wait(), 15)
            await wait_until(lambda: _pending_is(r, queue_name, 0), 10, what="B's ack")
        completed = [e for e in await events_of(r, queue_name) if e["e"] == "completed"]
        assert len(completed) == 1 and await r.xlen(k.stream) == 0
        assert a.alive(), a.log_tail()
        assert a.stop() == 0  # SIGTERM: A drains and exits cleanly (its log is flushed at exit)
        log = a.log.read_text()
        assert log.count("lease lost on 1 entries") == 1 and "finished after its lease was lost" in log, log
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        a.kill()
        await r.aclose()


async def _pending_is(r, queue: str, n: int) -> bool:
    return await pending_count(r, queue) == n


def _envelope() -> bytes:
    import msgpack

    from airflow_provider_chasqui.core.codec import Envelope, encode_envelope

    return encode_envelope(Envelope("paused-job", msgpack.packb({"i": 7}), 1, 0, None))
