"""One benchmark worker process: runs ``Worker`` until it processed ``--jobs`` deliveries.

Started by ``bench_engine.py`` after the queue was filled.  Prints one JSON line with the
process CPU (getrusage, all threads) spent between just before ``Worker.run()`` and its
return, and the wall time of that call.  Throughput is taken from the events stream by the
parent, so acknowledgements are included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_chasqui.engine.worker import Worker


async def noop(job):
    return None


async def fail_first(job):
    if job.attempt == 0:
        raise ValueError("first attempt fails")
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--jobs", type=int, required=True, help="deliveries to process before exiting (max_jobs)")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--handler", choices=("noop", "fail_first"), default="noop")
    ap.add_argument("--events-max-len", type=int, default=100_000)
    ap.add_argument("--uvloop", action="store_true")
    args = ap.parse_args()
    handler = noop if args.handler == "noop" else fail_first
    worker = Worker(
        args.queue,
        handler,
        redis_url=args.redis_url,
        concurrency=args.concurrency,
        events_enabled=True,
        store_results=False,
        run_scheduler=False,
        max_jobs=args.jobs,
        events_max_stream_len=args.events_max_len,
        shutdown_deadline_secs=10.0,
    )
    loop_name = "asyncio"
    runner = asyncio.run
    if args.uvloop:
        import uvloop

        runner = uvloop.run
        loop_name = "uvloop"
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    runner(worker.run())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        json.dumps(
            {
                "processed": worker.processed,
                "cpu_s": cpu,
                "user_s": r1.ru_utime - r0.ru_utime,
                "sys_s": r1.ru_stime - r0.ru_stime,
                "run_wall_s": wall,
                "loop": loop_name,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
