"""chasquimq's ``reconnect_max_attempts``: a worker that cannot reach Redis that many times in
a row stops, its ``run()`` raising ``ReconnectLimitError`` after the drain (at start, and when
the server goes away mid-run: the job it ran is settled or left pending, never lost); without
it, or with 0, it retries with backoff until stopped; ``chasqui worker --reconnect-max-attempts``
exits 1 saying why.  Bad values are refused naming the option."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import pytest
from engine_support import running, wait_until
from servers import free_port, start_server

from airflow_provider_chasqui import ConfigError, Job, ReconnectLimitError, SyncQueue, Worker

pytestmark = [pytest.mark.timeout(120), pytest.mark.single_node("servers of its own, stopped on purpose")]


async def test_a_worker_that_never_reaches_redis_gives_up_after_the_limit(queue_name: str) -> None:
    errors: list[BaseException] = []
    w = Worker(queue_name, lambda job: None, redis_url=f"redis://127.0.0.1:{free_port()}/0", reconnect_max_attempts=3)
    w.on("error", errors.append)
    started = time.monotonic()
    with pytest.raises(ReconnectLimitError, match=r"gave up after 3 failed attempts .*reconnect_max_attempts=3"):
        await asyncio.wait_for(w.run(), 30)
    assert time.monotonic() - started < 10 and len(errors) == 2, errors  # two retries heard, the third ends it
    unbounded = Worker(queue_name, lambda job: None, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    heard: list[BaseException] = []
    unbounded.on("error", heard.append)
    async with running(unbounded):
        await wait_until(lambda: len(heard) >= 5, 30, what="five retries without giving up")
    assert unbounded.settings.reconnect_max_attempts is None
    assert Worker("q", lambda job: None, reconnect_max_attempts=0).settings.reconnect_max_attempts is None


async def test_a_worker_gives_up_when_its_server_goes_away_mid_run(tmp_path: Any, queue_name: str) -> None:
    server = start_server("redis7", tmpdir=tmp_path)
    try:
        with SyncQueue(queue_name, redis_url=server.url) as q:
            first = q.add("t", {"i": 1})
        done: list[str] = []

        async def handler(job: Job) -> None:
            done.append(job.id)

        w = Worker(
            queue_name, handler, redis_url=server.url, reconnect_max_attempts=2, read_block_ms=200, run_scheduler=False
        )
        task = asyncio.ensure_future(w.run())
        await wait_until(lambda: done == [first.id], 20, what="the job to run")
        await asyncio.sleep(0.2)  # its ack flushed (ack_idle_ms is 5 ms)
        server.stop()
        with pytest.raises(ReconnectLimitError, match="reconnect_max_attempts=2"):
            await asyncio.wait_for(task, 60)
        server.start()
        with SyncQueue(queue_name, redis_url=server.url) as q:
            assert q.get_job_counts("waiting", "active") == {"waiting": 0, "active": 0}  # acked before the outage
    finally:
        server.stop()


def test_chasqui_worker_exits_1_saying_why(queue_name: str) -> None:
    cmd = [sys.executable, "-m", "airflow_provider_chasqui.cli", "worker", "--queue", queue_name, "--handlers"]
    cmd += ["json:dumps", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--reconnect-max-attempts", "2"]
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert b"gave up after 2 failed attempts" in done.stderr and b"Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, 10**9, float("nan")])
def test_bad_limits_are_refused_naming_the_option(bad: Any) -> None:
    with pytest.raises(ConfigError, match="reconnect_max_attempts"):
        Worker("q", lambda job: None, reconnect_max_attempts=bad)
