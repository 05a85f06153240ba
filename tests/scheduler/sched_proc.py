"""A scheduler process for the race and fail-over tests (not a test module).

    python sched_proc.py --redis-url URL --queue Q [--tick-ms 1000] [--always-lead] [--log-level INFO]
                         [--fire-url URL]

Prints ``ready <holder>`` once its loop runs, then schedules until SIGTERM.  ``--always-lead``
skips the leader lock, so several such processes fire concurrently and only the per-fire
compare-and-set stands between them and a double fire.  ``--fire-url`` sends the ticks (not
the lock calls) to another server: a dead port makes a leader whose renewals succeed while
every tick fails, the fault a leader must step down from.  Log lines (lock taken or lost,
Redis errors) go to stderr with a millisecond timestamp, so a fault test can line them up
with the fires it reads off the stream.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler


class AlwaysLeader(Scheduler):
    async def _acquire(self) -> bool:
        self.is_leader = True
        return True

    async def _release(self) -> None:
        self.is_leader = False


class SplitScheduler(Scheduler):
    """Takes and renews the lock through ``lock_driver``, fires through its own driver."""

    def __init__(self, lock_driver: AsyncDriver, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lock_driver = lock_driver

    async def _acquire(self) -> bool:
        fire_driver, self.driver = self.driver, self.lock_driver
        try:
            return await super()._acquire()
        finally:
            self.driver = fire_driver

    async def _release(self) -> None:
        fire_driver, self.driver = self.driver, self.lock_driver
        try:
            await super()._release()
        finally:
            self.driver = fire_driver


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--tick-ms", type=int, default=1000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--always-lead", action="store_true")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--fire-url", default=None)
    args = p.parse_args()
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(created).3f %(process)d %(levelname)s %(name)s: %(message)s",
    )
    driver = AsyncDriver(args.redis_url)
    fire_driver = None
    if args.fire_url:
        fire_driver = AsyncDriver(args.fire_url)
        sched: Scheduler = SplitScheduler(driver, fire_driver, args.queue, tick_ms=args.tick_ms, batch=args.batch)
    else:
        cls = AlwaysLeader if args.always_lead else Scheduler
        sched = cls(driver, args.queue, tick_ms=args.tick_ms, batch=args.batch)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sched.stop)
    task = asyncio.create_task(sched.run())
    print(f"ready {sched.holder}", flush=True)
    await task
    await driver.close()
    if fire_driver is not None:
        await fire_driver.close()
    print(f"stats fired={sched.fired_total} lost={sched.lost_total} ticks={sched.ticks}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
