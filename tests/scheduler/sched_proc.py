"""A scheduler process for the race and fail-over tests (not a test module).

    python sched_proc.py --redis-url URL --queue Q [--tick-ms 1000] [--always-lead]

Prints ``ready <holder>`` once its loop runs, then schedules until SIGTERM.  ``--always-lead``
skips the leader lock, so several such processes fire concurrently and only the per-fire
compare-and-set stands between them and a double fire.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from airflow_provider_chasqui.engine._driver import AsyncDriver  # noqa: E402
from airflow_provider_chasqui.engine.scheduler import Scheduler  # noqa: E402


class AlwaysLeader(Scheduler):
    async def _acquire(self) -> bool:
        self.is_leader = True
        return True

    async def _release(self) -> None:
        self.is_leader = False


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--tick-ms", type=int, default=1000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--always-lead", action="store_true")
    args = p.parse_args()
    driver = AsyncDriver(args.redis_url)
    cls = AlwaysLeader if args.always_lead else Scheduler
    sched = cls(driver, args.queue, tick_ms=args.tick_ms, batch=args.batch)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sched.stop)
    task = asyncio.create_task(sched.run())
    print(f"ready {sched.holder}", flush=True)
    await task
    await driver.close()
    print(f"stats fired={sched.fired_total} lost={sched.lost_total} ticks={sched.ticks}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
