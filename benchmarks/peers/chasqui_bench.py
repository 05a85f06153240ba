"""This project, measured exactly like the peers (same skeleton, handler-side timing):
``Queue.add`` / ``Queue.add_bulk`` (1,000 per call) / ``Worker(concurrency=50)`` with events
on, results off and the embedded cron scheduler off.  Runs in the project's own environment."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import _peer_common as common

from airflow_provider_chasqui.engine.queue import Queue
from airflow_provider_chasqui.engine.worker import Worker

try:
    from importlib.metadata import version as _version

    VERSION = _version("airflow-provider-chasqui")
except Exception:  # noqa: BLE001
    VERSION = "source"


async def noop(job):
    common.hit()
    return None


class Adapter:
    version = VERSION
    supports_delayed = True

    async def enqueue_single(self, url: str, queue: str, n: int) -> None:
        async with Queue(queue, redis_url=url) as q:
            for i in range(n):
                await q.add("noop", {"i": i})

    async def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        extra = {"delay_ms": int(delay_s * 1000)} if delay_s else {}
        async with Queue(queue, redis_url=url) as q:
            for start in range(0, n, 1000):
                await q.add_bulk(
                    [{"name": "noop", "data": {"i": i}, **extra} for i in range(start, min(n, start + 1000))]
                )

    async def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        worker = Worker(
            queue,
            noop,
            redis_url=url,
            concurrency=concurrency,
            events_enabled=True,
            store_results=False,
            run_scheduler=False,
            events_max_stream_len=max(100_000, 8 * n),
        )
        counter.start_clock()
        task = asyncio.create_task(worker.run())
        try:
            await counter.wait()
        finally:
            await worker.close()
            await task


if __name__ == "__main__":
    common.main(Adapter(), "chasqui")
