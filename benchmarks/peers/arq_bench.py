"""arq: ``enqueue_job`` one by one / 1,000 concurrent ``enqueue_job`` calls (arq has no bulk
API) / ``Worker(max_jobs=50, burst=True)``.  ``poll_delay`` is lowered from arq's 0.5 s to
0.01 s: at 0.5 s a worker starts at most ``max_jobs`` jobs per half second."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_common as common
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

try:
    from importlib.metadata import version as _version

    VERSION = _version("arq")
except Exception:  # noqa: BLE001
    VERSION = "?"


async def noop(ctx, i):
    common.hit()
    return None


class Adapter:
    version = VERSION
    supports_delayed = True

    async def enqueue_single(self, url: str, queue: str, n: int) -> None:
        pool = await create_pool(RedisSettings.from_dsn(url), default_queue_name=queue)
        try:
            for i in range(n):
                await pool.enqueue_job("noop", i)
        finally:
            await pool.aclose()

    async def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        pool = await create_pool(RedisSettings.from_dsn(url), default_queue_name=queue)
        try:
            for start in range(0, n, 1000):
                await asyncio.gather(
                    *(pool.enqueue_job("noop", i, _defer_by=delay_s) for i in range(start, min(n, start + 1000)))
                )
        finally:
            await pool.aclose()

    async def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        worker = Worker(
            functions=[noop],
            queue_name=queue,
            redis_settings=RedisSettings.from_dsn(url),
            burst=True,
            max_jobs=concurrency,
            handle_signals=False,
            poll_delay=0.01,
        )
        counter.start_clock()
        try:
            await worker.main()
        finally:
            await worker.close()


if __name__ == "__main__":
    common.main(Adapter(), "arq")
