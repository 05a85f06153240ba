"""taskiq with taskiq-redis' ``RedisStreamBroker``: ``task.kiq()`` one by one / 1,000
concurrent ``kiq()`` calls (no bulk API) / ``run_receiver_task(max_async_tasks=50)`` in one
process.  Delayed jobs need taskiq's separate scheduler process and a schedule source, so that
workload is reported as unsupported."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_common as common
from taskiq.api import run_receiver_task
from taskiq_redis import RedisStreamBroker

try:
    from importlib.metadata import version as _version

    VERSION = f"{_version('taskiq')} (taskiq-redis {_version('taskiq-redis')})"
except Exception:  # noqa: BLE001
    VERSION = "?"


async def noop(i: int) -> None:
    common.hit()


def _broker(url: str, queue: str) -> tuple[RedisStreamBroker, object]:
    # consumer_id "0": a group created after the producer started still sees every entry
    broker = RedisStreamBroker(url, queue_name=queue, consumer_id="0")
    task = broker.register_task(noop, task_name="noop")
    return broker, task


class Adapter:
    version = VERSION
    supports_delayed = False
    delayed_note = "needs taskiq's separate scheduler process and a schedule source"

    async def enqueue_single(self, url: str, queue: str, n: int) -> None:
        broker, task = _broker(url, queue)
        await broker.startup()
        try:
            for i in range(n):
                await task.kiq(i)
        finally:
            await broker.shutdown()

    async def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        broker, task = _broker(url, queue)
        await broker.startup()
        try:
            for start in range(0, n, 1000):
                await asyncio.gather(*(task.kiq(i) for i in range(start, min(n, start + 1000))))
        finally:
            await broker.shutdown()

    async def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        broker, _task = _broker(url, queue)
        broker.is_worker_process = True
        await broker.startup()
        counter.start_clock()
        runner = asyncio.create_task(run_receiver_task(broker, max_async_tasks=concurrency))
        try:
            await counter.wait()
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await broker.shutdown()


if __name__ == "__main__":
    common.main(Adapter(), "taskiq")
