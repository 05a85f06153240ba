"""Signals and outages: a worker subprocess drains on SIGTERM/SIGINT, and a worker survives
its Redis being restarted underneath it (same port), never crashing and never losing a job."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_support import raw_sync, running, wait_until, wait_until_sync
from servers import start_server

from airflow_provider_chasqui import Job, Queue
from airflow_provider_chasqui.core.keys import QueueKeys

WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import redis.asyncio as aioredis
    from airflow_provider_chasqui import Worker

    url, queue, tag = sys.argv[1:4]

    async def main():
        if url.endswith("?cluster=true"):  # the test cluster: route by key slot
            r = aioredis.RedisCluster.from_url(url.removesuffix("?cluster=true"))
        else:
            r = aioredis.Redis.from_url(url)

        async def handler(job):
            await r.rpush(tag + ":started", job.id)
            await r.blpop([tag + ":release"], timeout=60)  # the test decides when we finish
            await r.rpush(tag + ":finished", job.id)
            return "done"

        w = Worker(queue, handler, redis_url=url, install_signal_handlers=True, run_scheduler=False,
                   concurrency=2, read_block_ms=5000)
        await w.run()
        await r.aclose()
        print("drained", w.processed, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_in_flight_jobs_in_a_real_process(redis_url, queue_name, tmp_path: Path, sig) -> None:
    k = QueueKeys.for_queue(queue_name)
    tag = k.prefix + ":test"  # under the queue's hash tag, so the fixture cleans it up
    script = tmp_path / "worker_proc.py"
    script.write_text(WORKER_SCRIPT)
    with raw_sync(redis_url) as r:

        async def add_two() -> list[str]:
            async with Queue(queue_name, redis_url=redis_url) as q:
                return [(await q.add("slow", i)).id for i in range(2)]

        ids = asyncio.run(add_two())
        proc = subprocess.Popen(
            [sys.executable, str(script), redis_url, queue_name, tag],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until_sync(
                lambda: r.llen(tag + ":started") == 2 or proc.poll() is not None,
                timeout=30,
                what="both jobs started in the subprocess",
            )
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(sig)
            # the in-flight handlers are still allowed to finish: release them now
            r.rpush(tag + ":release", "go", "go")
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        assert "drained 2" in out
        assert sorted(x.decode() for x in r.lrange(tag + ":finished", 0, -1)) == sorted(ids)
        assert r.xlen(k.stream) == 0
        assert r.xpending(k.stream, "default")["pending"] == 0
        completed = [f for _id, f in r.xrange(k.events) if f[b"e"] == b"completed"]
        assert sorted(f[b"id"].decode() for f in completed) == sorted(ids)
        assert r.exists(k.promoter_lock) == 0  # released on the way out


# Single node by nature (no redis_url): it kills and restarts the one server it started.
@pytest.mark.parametrize("persistence", ["aof", "none"])
async def test_worker_survives_a_redis_restart_on_the_same_port(tmp_path: Path, persistence, worker_factory) -> None:
    extra = ("--appendonly", "yes", "--appendfsync", "always") if persistence == "aof" else ()
    server = start_server("redis7", tmpdir=tmp_path, extra_args=extra)
    queue_name = "restart-q"
    k = QueueKeys.for_queue(queue_name)
    seen: list[int] = []
    release = asyncio.Event()

    async def handler(job: Job) -> int:
        if job.data == "hold":
            await release.wait()  # in flight while the server goes away
        seen.append(job.data)
        return 1

    r = server.client()
    q = Queue(queue_name, redis_url=server.url)
    try:
        w = worker_factory(queue_name, handler, server.url, promoter_poll_ms=20, claim_min_idle_ms=1000)
        async with running(w) as task:
            await q.add("r", 1)
            await wait_until(lambda: seen == [1], what="first job")
            if persistence == "aof":
                await q.add("r", "hold")
                await wait_until(lambda: _in_flight(w), what="the held job running")
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)
            assert not task.done()
            release.set()
            await q.add("r", 2)
            await q.add("r", 3, delay=100)  # through the promoter too
            expected = [1, "hold", 2, 3] if persistence == "aof" else [1, 2, 3]
            await wait_until(
                lambda: sorted(map(str, seen)) == sorted(map(str, expected)), timeout=60, what="jobs after the restart"
            )
            await wait_until(lambda: r.xlen(k.stream) == 0, timeout=30, what="all acked")
            assert not task.done()
        assert r.xpending(k.stream, "default")["pending"] == 0
    finally:
        await q.close()
        r.close()
        server.stop()


def _in_flight(w) -> bool:
    intake = getattr(w, "_intake", None)
    return bool(intake is not None and intake.in_flight)


# Single node by nature: a private server whose argument limit is the smallest Redis allows.
async def test_a_result_past_the_servers_argument_limit_runs_once_with_the_default_settings(
    tmp_path: Path, worker_factory
) -> None:
    """``proto-max-bulk-len 1mb`` (Redis' smallest): a handler returning 2 MiB made the ack
    carrying its result fail with "invalid bulk length", the entry stayed pending and ran
    again after each lease, up to its attempts.  With the default ``max_result_bytes`` (1 MiB,
    the same smallest limit) its job is dead-lettered ``unrecoverable`` after one run, and the
    jobs around it complete once."""
    server = start_server("redis7", tmpdir=tmp_path, extra_args=("--proto-max-bulk-len", "1mb"))
    queue_name = "big-result-q"
    k = QueueKeys.for_queue(queue_name)
    runs: dict[int, int] = {}

    async def handler(job: Job) -> object:
        runs[job.data] = runs.get(job.data, 0) + 1
        return b"x" * (2 << 20) if job.data == 0 else job.data

    r = server.client()
    q = Queue(queue_name, redis_url=server.url)
    try:
        jobs = await q.add_bulk([{"name": "r", "data": i, "attempts": 3} for i in range(10)])
        w = worker_factory(queue_name, handler, server.url, store_results=True, claim_min_idle_ms=1000)
        async with running(w):
            await wait_until(lambda: r.xlen(k.dlq), 30, what="the big result's job dead-lettered")
            await wait_until(lambda: not r.xpending(k.stream, "default")["pending"], 30, what="every entry acked")
            for j in jobs[1:]:
                assert await q.wait_for_result(j.id, timeout=30) == j.data
        assert runs == dict.fromkeys(range(10), 1), runs
        failure = await q.get_failure(jobs[0].id)
        assert failure.reason == "unrecoverable" and "max_result_bytes=1,048,576" in failure.error
    finally:
        await q.close()
        r.close()
        server.stop()
