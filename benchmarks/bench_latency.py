"""Latency at a fixed offered load (issue 7), on a private redis-server.

1. enqueue -> handler start: a producer adds jobs at ``--rate`` jobs/s (a batch every 10 ms,
   each job carrying its send time); one worker process (concurrency 50, events on) records
   ``handler start - send time`` per job.  p50/p99 in ms, plus the achieved rate.
2. job completion -> trigger event: ``ChasquiJobTrigger`` (the deferrable sensor's trigger, run
   here outside a triggerer) waits for each of ``--trigger-jobs`` jobs, ``--waiters`` at a time;
   latency = the trigger's event time - the ``completed`` event's timestamp (worker clock, ms).

    python benchmarks/bench_latency.py [--rate 5000] [--seconds 10] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, machine, private_redis, redis_version, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "latency.json"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


# ---- the worker process ------------------------------------------------------------------------
def run_worker(url: str, queue: str, jobs: int, out: str) -> None:
    from airflow_provider_chasqui import Worker

    starts: list[float] = []

    async def handler(job: Any) -> int:
        sent = job.data.get("t")
        if sent is not None:
            starts.append((time.time_ns() - sent) / 1e6)
        return 1

    worker = Worker(
        queue,
        handler,
        redis_url=url,
        concurrency=50,
        store_results=True,
        run_scheduler=False,
        max_jobs=jobs,
        read_block_ms=1000,
    )
    asyncio.run(worker.run())
    Path(out).write_text(json.dumps(starts))


def start_worker(url: str, queue: str, jobs: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "worker",
            "--redis-url",
            url,
            "--queue",
            queue,
            "--jobs",
            str(jobs),
            "--out",
            str(out),
        ]
    )


def wait_for_group(url: str, queue: str, timeout: float = 30) -> None:
    import redis

    r = redis.Redis.from_url(url)
    key = "{chasqui:" + queue + "}:stream"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.exists(key) and r.xinfo_groups(key):
            return
        time.sleep(0.05)
    raise SystemExit("the worker did not create its consumer group in time")


# ---- 1: enqueue -> handler start ------------------------------------------------------------------
def offered_load(url: str, queue: str, rate: int, seconds: float) -> tuple[int, float]:
    from airflow_provider_chasqui import SyncQueue

    q = SyncQueue(queue, redis_url=url)
    per_tick = max(1, rate // 100)
    sent, start = 0, time.perf_counter()
    total = int(rate * seconds)
    while sent < total:
        n = min(per_tick, total - sent)
        now = time.time_ns()
        q.add_bulk([{"name": "lat", "data": {"t": now}} for _ in range(n)])
        sent += n
        next_tick = start + sent / rate
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # pacing the offered load, not synchronisation
    elapsed = time.perf_counter() - start
    q.close()
    return sent, sent / elapsed


# ---- 2: completion -> trigger event ---------------------------------------------------------------
async def trigger_latency(url: str, queue: str, jobs: int, waiters: int) -> list[float]:
    from urllib.parse import urlparse

    parts = urlparse(url)
    os.environ["AIRFLOW_CONN_CHASQUI_BENCH"] = json.dumps(
        {"conn_type": "chasqui", "host": parts.hostname, "port": parts.port}
    )
    import logging

    from airflow_provider_chasqui import Queue
    from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger

    logging.getLogger("airflow_provider_chasqui").setLevel(logging.WARNING)

    q = Queue(queue, redis_url=url)
    latencies: list[float] = []
    sem = asyncio.Semaphore(waiters)

    async def first_event(trigger: ChasquiJobTrigger) -> tuple[float, dict[str, Any]]:
        async for event in trigger.run():
            return time.time_ns() / 1e6, event.payload
        raise RuntimeError("the trigger ended without an event")

    async def one() -> None:
        async with sem:
            job_id = uuid.uuid4().hex
            trigger = ChasquiJobTrigger(job_ids=[job_id], queue_name=queue, chasqui_conn_id="chasqui_bench")
            waiting = asyncio.create_task(first_event(trigger))
            await asyncio.sleep(0.2)  # let the trigger reach its blocking read before the job exists
            await q.add("done", {}, job_id=job_id)
            fired_ms, payload = await waiting
            assert payload["status"] == "success", payload
            rows = await q.driver.client.execute_command("XREVRANGE", q.keys.events, "+", "-", "COUNT", 2000)
            done = [int(f[f.index(b"ts") + 1]) for _id, f in rows if b"completed" in f and job_id.encode() in f]
            latencies.append(fired_ms - done[0])

    await asyncio.gather(*(one() for _ in range(jobs)))
    await q.close()
    return latencies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=("main", "worker"), default="main")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--queue", default=None)
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--rate", type=int, default=5000, help="offered load, jobs/s")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--trigger-jobs", type=int, default=200)
    ap.add_argument("--waiters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="1 s at 500 jobs/s, 20 trigger waits")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.role == "worker":
        run_worker(args.redis_url, args.queue, args.jobs, args.out)
        return 0
    if args.smoke:
        args.rate, args.seconds, args.trigger_jobs, args.waiters = 500, 1.0, 20, 5
    out = Path(args.out) if args.out else RESULTS
    with private_redis(args.redis_url) as url:
        queue = f"lat-{uuid.uuid4().hex[:8]}"
        total = int(args.rate * args.seconds)
        starts_file = out.with_suffix(".starts.tmp")
        worker = start_worker(url, queue, total + args.trigger_jobs, starts_file)
        try:
            wait_for_group(url, queue)
            log(f"offered load: {args.rate:,} jobs/s for {args.seconds:g} s")
            sent, achieved = offered_load(url, queue, args.rate, args.seconds)
            log(f"trigger latency: {args.trigger_jobs} jobs, {args.waiters} waiters")
            trig = asyncio.run(trigger_latency(url, queue, args.trigger_jobs, args.waiters))
            worker.wait(timeout=120)
        finally:
            if worker.poll() is None:
                worker.terminate()
                worker.wait(10)
        starts = json.loads(starts_file.read_text())
        starts_file.unlink()
        result = {
            "benchmark": "latency",
            "mode": "smoke" if args.smoke else "full",
            "redis_version": redis_version(url),
            "machine": machine(),
            "enqueue_to_handler": {
                "offered_rate": args.rate,
                "achieved_rate": round(achieved),
                "jobs": sent,
                "p50_ms": round(pct(starts, 50), 2),
                "p99_ms": round(pct(starts, 99), 2),
            },
            "completion_to_trigger": {
                "jobs": len(trig),
                "waiters": args.waiters,
                "p50_ms": round(pct(trig, 50), 2),
                "p99_ms": round(pct(trig, 99), 2),
            },
        }
    e, t = result["enqueue_to_handler"], result["completion_to_trigger"]
    print(
        f"enqueue -> handler start at {e['achieved_rate']:,} jobs/s offered: p50 {e['p50_ms']} ms, p99 {e['p99_ms']} ms"
    )
    print(
        f"job completion -> trigger event ({t['jobs']} jobs, {t['waiters']} waiters): "
        f"p50 {t['p50_ms']} ms, p99 {t['p99_ms']} ms"
    )
    write_json(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
