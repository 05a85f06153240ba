"""SAQ: ``Queue.enqueue`` one by one / 1,000 concurrent ``enqueue`` calls (SAQ's ``map`` and
``apply`` wait for results, so there is no fire-and-forget bulk API) / ``Worker(concurrency=50)``.
Delayed jobs use ``scheduled=`` (epoch seconds) and the worker's scheduler (default 1 s poll)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_common as common
from saq import Queue, Worker

try:
    from importlib.metadata import version as _version

    VERSION = _version("saq")
except Exception:  # noqa: BLE001
    VERSION = "?"


async def noop(ctx, *, i):
    common.hit()
    return None


class Adapter:
    version = VERSION
    supports_delayed = True

    async def enqueue_single(self, url: str, queue: str, n: int) -> None:
        q = Queue.from_url(url, name=queue)
        await q.connect()
        try:
            for i in range(n):
                await q.enqueue("noop", i=i)
        finally:
            await q.disconnect()

    async def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        q = Queue.from_url(url, name=queue)
        await q.connect()
        extra = {"scheduled": int(time.time() + delay_s + 0.999)} if delay_s else {}
        try:
            for start in range(0, n, 1000):
                await asyncio.gather(*(q.enqueue("noop", i=i, **extra) for i in range(start, min(n, start + 1000))))
        finally:
            await q.disconnect()

    async def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        q = Queue.from_url(url, name=queue)
        worker = Worker(q, functions=[noop], concurrency=concurrency)
        counter.start_clock()
        task = asyncio.create_task(worker.start())
        try:
            await counter.wait()
        finally:
            await worker.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await q.disconnect()


if __name__ == "__main__":
    common.main(Adapter(), "saq")
