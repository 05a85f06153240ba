"""BullMQ for Python: ``Queue.add`` / ``Queue.addBulk`` / ``Worker`` (concurrency 50)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_common as common
from bullmq import Queue, Worker

try:
    from importlib.metadata import version as _version

    VERSION = _version("bullmq")
except Exception:  # noqa: BLE001
    VERSION = "?"


async def noop(job, token):
    common.hit()
    return None


class Adapter:
    version = VERSION
    supports_delayed = True

    async def enqueue_single(self, url: str, queue: str, n: int) -> None:
        q = Queue(queue, {"connection": url})
        try:
            for i in range(n):
                await q.add("noop", {"i": i})
        finally:
            await q.close()

    async def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        q = Queue(queue, {"connection": url})
        opts = {"delay": int(delay_s * 1000)} if delay_s else {}
        try:
            for start in range(0, n, 1000):
                await q.addBulk(
                    [{"name": "noop", "data": {"i": i}, "opts": opts} for i in range(start, min(n, start + 1000))]
                )
        finally:
            await q.close()

    async def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        counter.start_clock()
        worker = Worker(queue, noop, {"connection": url, "concurrency": concurrency})
        try:
            await counter.wait()
        finally:
            await worker.close()
        await asyncio.sleep(0)


if __name__ == "__main__":
    common.main(Adapter(), "bullmq")
