"""Many deferred waits in one process (issue 18): CPU, completion-to-wake latency, connections.

One waiting process runs ``--waiters`` real ``ChasquiJobTrigger.run()`` coroutines (a
triggerer's deferred sensors; in ``--mode old`` the pre-hub path instead: one ``Queue`` per
waiter, each following the whole events stream itself).  Each waiter waits for one job; when
it fires it re-arms on the next job of its slot, so ``--waiters`` are waiting all along.  A
worker process (concurrency 50, results stored) runs the jobs a producer process offers at
``--rate`` jobs/s; ``--waited-rate`` of them per second are the waited ones, the rest filler.

Reported for the offered window: the waiting process's CPU (``os.times``, % of one core),
the latency from a job's ``completed`` event (its ``ts``, the worker's clock in ms) to its
trigger's event, p50/p99, the Redis connections the waiting process holds (its sockets to
the server, from /proc) and the named event readers (``CLIENT LIST``), and the achieved rate.

    python benchmarks/bench_waiters.py [--waiters 1000] [--rate 5000] [--seconds 20]
        [--mode hub|old] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
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

RESULTS = Path(__file__).resolve().parent / "results" / "waiters.json"
TICK_S = 0.01  # the producer adds a batch every 10 ms


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


def waited_id(n: int, waiters: int) -> str:
    """The n-th waited job: slot ``n % waiters``, its ``n // waiters``-th job."""
    return f"s{n % waiters}-{n // waiters}"


# ---- the worker process ------------------------------------------------------------------------
def run_worker(url: str, queue: str) -> None:
    from airflow_provider_chasqui import Worker

    async def handler(job: Any) -> int:
        return 1

    worker = Worker(
        queue,
        handler,
        redis_url=url,
        concurrency=50,
        store_results=True,
        run_scheduler=False,
        read_block_ms=1000,
        events_max_stream_len=5_000_000,
        install_signal_handlers=True,
    )
    asyncio.run(worker.run())


# ---- the producer process ----------------------------------------------------------------------
def run_producer(url: str, queue: str, rate: int, seconds: float, waited_rate: int, waiters: int, out: str) -> None:
    from airflow_provider_chasqui import SyncQueue

    q = SyncQueue(queue, redis_url=url)
    per_tick = max(1, round(rate * TICK_S))
    waited_per_tick = waited_rate * TICK_S
    sent = waited = 0
    owed = 0.0
    start = time.perf_counter()
    total = int(rate * seconds)
    while sent < total:
        n = min(per_tick, total - sent)
        owed += waited_per_tick
        w = min(int(owed), n)
        owed -= w
        items: list[dict[str, Any]] = [
            {"name": "w", "data": 0, "job_id": waited_id(waited + i, waiters)} for i in range(w)
        ]
        items += [{"name": "f", "data": 0} for _ in range(n - w)]
        q.add_bulk(items)
        sent += n
        waited += w
        pause = start + sent / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # pacing the offered load, not synchronisation
    elapsed = time.perf_counter() - start
    q.close()
    Path(out).write_text(json.dumps({"sent": sent, "waited": waited, "seconds": elapsed}))


# ---- the waiting process (this one) ------------------------------------------------------------
def proc_sockets_to(port: int) -> int:
    """Established TCP connections of this process to ``port`` (from /proc; Linux only)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "01" and int(cols[2].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                count += 1
    return count


async def old_style_wait(url: str, queue: str, job_id: str, stop: asyncio.Event) -> dict[str, Any]:
    """The pre-hub trigger: its own Queue following the whole stream (a Queue given its own
    driver still waits that way), in the trigger's chunks."""
    from airflow_provider_chasqui import Queue
    from airflow_provider_chasqui.core.urls import WAIT_BLOCK_MS, read_timeout
    from airflow_provider_chasqui.engine._driver import AsyncDriver

    q = Queue(queue, redis_url=url, driver=AsyncDriver(url, socket_timeout=read_timeout(WAIT_BLOCK_MS)))
    try:
        while not stop.is_set():  # (redis-py can swallow a cancel that lands as a reply arrives)
            outcomes = await q.wait_for_results([job_id], timeout=2.0, stop_on_failure=True)
            if job_id in outcomes:
                return {"status": "success", "results": {job_id: outcomes[job_id][1]}}
        return {"status": "stopped"}
    finally:
        await q.close()


async def waiting_side(url: str, queue: str, args: argparse.Namespace) -> dict[str, Any]:
    import redis

    from airflow_provider_chasqui.core.event_hub import reader_name
    from airflow_provider_chasqui.engine.event_hub import active_hubs
    from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger

    logging.disable(logging.INFO)  # the triggers' "waiting for ..." lines: a triggerer writes them to task logs
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    wakes: dict[str, float] = {}  # job id -> wall ms its trigger fired
    stop = asyncio.Event()

    async def fire_once(job_id: str) -> dict[str, Any]:
        if args.mode == "old":
            return await old_style_wait(url, queue, job_id, stop)
        trigger = ChasquiJobTrigger(job_ids=[job_id], queue_name=queue, chasqui_conn_id="chasqui_bench")
        async for event in trigger.run():
            return event.payload
        raise RuntimeError("the trigger ended without an event")

    async def slot(i: int) -> None:
        k = 0
        while not stop.is_set():
            job_id = f"s{i}-{k}"
            payload = await fire_once(job_id)
            if payload["status"] == "stopped":
                return
            wakes[job_id] = time.time_ns() / 1e6
            assert payload["status"] == "success", payload
            k += 1

    tasks = [asyncio.create_task(slot(i)) for i in range(args.waiters)]

    def registered() -> int:
        if args.mode == "old":
            return args.waiters
        return sum(h.waiters for h in active_hubs() if h.name == queue)

    deadline = time.monotonic() + 120
    while registered() < args.waiters:
        if time.monotonic() > deadline:
            raise SystemExit("the waiters did not all register")
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the old path's waiters reach their blocking reads
    if args.gc_freeze:
        # Airflow's imports leave millions of objects for each full collection to walk: on this box
        # one took up to 1.7 s, a stall of every task of the loop, hub or not (see BENCHMARKS.md)
        gc.collect()
        gc.freeze()

    producer_out = Path(args.out_dir) / f"producer-{uuid.uuid4().hex[:6]}.json"
    producer = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "producer",
            "--redis-url",
            url,
            "--queue",
            queue,
            "--rate",
            str(args.rate),
            "--seconds",
            str(args.seconds),
            "--waited-rate",
            str(args.waited_rate),
            "--waiters",
            str(args.waiters),
            "--out",
            str(producer_out),
        ]
    )
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t0, c0 = time.perf_counter(), os.times()
    sockets: list[int] = []
    while producer.poll() is None:
        await asyncio.sleep(0.1)
        if not sockets and time.perf_counter() - t0 > args.seconds / 2:
            sockets.append(proc_sockets_to(port))  # once, mid-window: /proc/net/tcp is long on a busy box
    t1, c1 = time.perf_counter(), os.times()
    sockets.append(proc_sockets_to(port))
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    produced = json.loads(producer_out.read_text())
    producer_out.unlink()
    with redis.Redis.from_url(url) as r:
        readers = sum(1 for c in r.client_list() if c.get("name") == reader_name(queue))
    await asyncio.sleep(2.0)  # the window's last waited jobs fire
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.wait(tasks, timeout=60)

    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    # completion times: the ``completed`` events of the waited jobs (the worker's clock, ms)
    done: dict[str, int] = {}
    done_ts: dict[str, int] = {}
    with redis.Redis.from_url(url) as r:
        events = "{chasqui:" + queue + "}:events"
        start = "-"
        while True:
            rows = r.xrange(events, start, "+", count=10_000)
            for entry_id, f in rows:
                jid = f.get(b"id", b"")
                if f.get(b"e") == b"completed" and jid.startswith(b"s"):
                    done[jid.decode()] = int(entry_id.split(b"-", 1)[0])  # when Redis wrote it (its clock)
                    done_ts[jid.decode()] = int(f[b"ts"])
            if len(rows) < 10_000:
                break
            start = "(" + rows[-1][0].decode()
    latencies = [wakes[j] - done[j] for j in wakes if j in done]
    ts_lat = [wakes[j] - done_ts[j] for j in wakes if j in done_ts]
    log(f"from the events' ts field (the worker's clock): p50 {pct(ts_lat, 50):.1f} ms, p99 {pct(ts_lat, 99):.1f} ms")
    return {
        "mode": args.mode,
        "waiters": args.waiters,
        "offered_rate": args.rate,
        "achieved_rate": round(produced["sent"] / produced["seconds"]),
        "jobs": produced["sent"],
        "waited_jobs": produced["waited"],
        "woken": len(latencies),
        "cpu_pct_of_core": round(100 * cpu / (t1 - t0), 1),
        "window_s": round(t1 - t0, 2),
        "wake_p50_ms": round(pct(latencies, 50), 1),
        "wake_p99_ms": round(pct(latencies, 99), 1),
        "wake_max_ms": round(max(latencies), 1) if latencies else None,
        "redis_connections": max(sockets) if sockets else 0,
        "named_event_readers": readers,
        "gc_freeze": args.gc_freeze,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=("main", "worker", "producer"), default="main")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--queue", default=None)
    ap.add_argument("--mode", choices=("hub", "old"), default="hub")
    ap.add_argument("--waiters", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=5000, help="offered load, jobs/s")
    ap.add_argument("--waited-rate", type=int, default=50, help="of which waited jobs, per second")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the start-up heap to the collector (full collections stall the loop)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the waiting process over the window (stderr)")
    ap.add_argument("--smoke", action="store_true", help="50 waiters, 3 s at 500 jobs/s")
    ap.add_argument("--out", default=None)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    if args.role == "worker":
        run_worker(args.redis_url, args.queue)
        return 0
    if args.role == "producer":
        run_producer(args.redis_url, args.queue, args.rate, args.seconds, args.waited_rate, args.waiters, args.out)
        return 0
    if args.smoke:
        args.waiters, args.rate, args.seconds, args.waited_rate = 50, 500, 3.0, 50
    out = Path(args.out) if args.out else RESULTS
    args.out_dir = str(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    with private_redis(args.redis_url) as url:
        host_port = url.split("://", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        os.environ["AIRFLOW_CONN_CHASQUI_BENCH"] = json.dumps({"conn_type": "chasqui", "host": host, "port": int(port)})
        # a triggerer writes the triggers' info lines to task logs; here they would only flood stderr
        os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
        queue = f"wait-{uuid.uuid4().hex[:8]}"
        worker = subprocess.Popen([sys.executable, __file__, "--role", "worker", "--redis-url", url, "--queue", queue])
        try:
            log(f"{args.waiters} waiters ({args.mode}), {args.rate:,} jobs/s offered for {args.seconds:g} s")
            figures = asyncio.run(waiting_side(url, queue, args))
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        result = {
            "benchmark": "waiters",
            "mode": "smoke" if args.smoke else "full",
            "redis_version": redis_version(url),
            "machine": machine(),
            "results": figures,
        }
    f = result["results"]
    print(
        f"{f['waiters']} waiting triggers ({f['mode']}) at {f['achieved_rate']:,} jobs/s: "
        f"CPU {f['cpu_pct_of_core']}% of a core, wake p50 {f['wake_p50_ms']} ms, p99 {f['wake_p99_ms']} ms "
        f"({f['woken']} wakes), {f['redis_connections']} Redis connection(s), "
        f"{f['named_event_readers']} event reader(s)"
    )
    write_json(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
