"""Soak: memory stays flat under sustained load with default settings.

A producer offers a fixed rate (default 3,000 jobs/s) for ``--minutes`` (default 3) to one
queue on a private ``redis-server``; one ``chasqui worker`` process (defaults: results stored,
events on; 1% of jobs fail once and are retried) consumes it.  Every ``--interval`` seconds
the script samples Redis ``used_memory`` (also without the job stream, whose size is the
backlog when the worker falls behind the offer), ``DBSIZE``, the stream backlog, the events
stream, the results index and the worker's RSS.  After a warm-up (the events stream and the results
cap fill up: the first third of the run, at least 30 s for full runs) it reports, per metric,
the mean of the first and the last third of the remaining samples and the least-squares
slope per minute.  Flat = the last third is within a few percent of the first.

    python benchmarks/bench_soak.py                   # 3 min at 3,000 jobs/s
    python benchmarks/bench_soak.py --minutes 0.5     # a short smoke
    python benchmarks/bench_soak.py --redis-url redis://127.0.0.1:6379/0   # a server of yours

With a server of yours, ``DBSIZE`` counts other keys too: use a private one for key counts.
Writes ``benchmarks/results/soak.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from _common import HERE, RESULTS, ROOT, log, machine, private_redis, redis_version, write_json

from airflow_provider_chasqui import Queue
from airflow_provider_chasqui.core.keys import QueueKeys

METRICS = ("used_memory", "memory_excl_stream", "dbsize", "result_keys", "events_len", "worker_rss", "backlog")


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _sample(r: redis.Redis, keys: QueueKeys, worker_pid: int, t0: float, offered: int) -> dict[str, Any]:
    pipe = r.pipeline(transaction=False)
    pipe.info("memory")
    pipe.dbsize()
    pipe.zcard(keys.results)
    pipe.xlen(keys.events)
    pipe.xlen(keys.stream)
    pipe.memory_usage(keys.stream)
    mem, dbsize, results, events, backlog, stream_mem = pipe.execute()
    used = int(mem["used_memory"])
    return {
        "t": round(time.monotonic() - t0, 2),
        "offered": offered,
        "used_memory": used,
        "memory_excl_stream": used - int(stream_mem or 0),
        "dbsize": int(dbsize),
        "result_keys": int(results),
        "events_len": int(events),
        "backlog": int(backlog),
        "worker_rss": _rss(worker_pid),
    }


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if den == 0 else 60 * sum((t - mx) * (v - my) for t, v in points) / den


def summarise(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    steady = [s for s in samples if s["t"] >= warmup_s]
    if len(steady) < 3:
        steady = samples[len(samples) // 3 :]
    third = max(1, len(steady) // 3)
    first, last = steady[:third], steady[-third:]
    out: dict[str, Any] = {"steady_samples": len(steady), "steady_from_s": steady[0]["t"] if steady else None}
    for m in METRICS:
        a = sum(s[m] for s in first) / len(first)
        b = sum(s[m] for s in last) / len(last)
        out[m] = {
            "first_third": round(a),
            "last_third": round(b),
            "change_pct": round(100 * (b - a) / a, 2) if a else 0.0,
            "slope_per_min": round(_slope_per_min([(s["t"], s[m]) for s in steady]), 1),
            "max": max(s[m] for s in samples),
        }
    return out


async def _produce(q: Queue, rate: int, seconds: float, state: dict[str, int]) -> None:
    """Offer ``rate`` jobs/s in ticks of 50 ms, catching up after a late tick (never bursting
    beyond the schedule); 1 job in 100 fails its first attempt."""
    tick = 0.05
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        if elapsed >= seconds:
            return
        due = min(int(rate * elapsed) + 1, int(rate * seconds))
        n = due - state["offered"]
        if n > 0:
            base = state["offered"]
            await q.add_bulk(
                [{"name": "work", "data": {"i": i, "f": 1} if i % 100 == 0 else {"i": i}} for i in range(base, due)]
            )
            state["offered"] = due
        await asyncio.sleep(max(0.0, tick - (time.monotonic() - t0 - elapsed)))


async def soak(url: str, rate: int, minutes: float, interval: float) -> dict[str, Any]:
    queue = f"soak-{uuid.uuid4().hex[:8]}"
    keys = QueueKeys.for_queue(queue)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.worker",
            "--queue",
            queue,
            "--handlers",
            "_soak_handlers",
            "--redis-url",
            url,
            "--no-scheduler",
            "--log-level",
            "ERROR",
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = minutes * 60
    samples: list[dict[str, Any]] = []
    state = {"offered": 0}
    try:
        with redis.Redis.from_url(url) as r:
            deadline = time.monotonic() + 30
            while not r.exists(keys.stream):  # the worker creates its group (MKSTREAM) when it starts
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not start:\n{worker.stderr.read() if worker.stderr else ''}")
                await asyncio.sleep(0.05)
            async with Queue(queue, redis_url=url) as q:
                t0 = time.monotonic()
                producer = asyncio.create_task(_produce(q, rate, seconds, state))
                while not producer.done():
                    samples.append(_sample(r, keys, worker.pid, t0, state["offered"]))
                    log(
                        f"[soak] t={samples[-1]['t']:6.1f}s offered={state['offered']:>8} "
                        f"used_memory={samples[-1]['used_memory'] / 1e6:7.2f} MB dbsize={samples[-1]['dbsize']:>7} "
                        f"backlog={samples[-1]['backlog']:>6} worker_rss={samples[-1]['worker_rss'] / 1e6:6.1f} MB"
                    )
                    await asyncio.wait({producer}, timeout=interval)
                await producer
                elapsed = time.monotonic() - t0
                samples.append(_sample(r, keys, worker.pid, t0, state["offered"]))
            if worker.poll() is not None:
                raise SystemExit(f"the worker died:\n{worker.stderr.read() if worker.stderr else ''}")
            # the backlog left when the offer stops: did the worker keep up?
            drained_by = time.monotonic() + 60
            while r.xlen(keys.stream) and time.monotonic() < drained_by:
                await asyncio.sleep(0.1)
            backlog_end = int(r.xlen(keys.stream))
            completed = int(r.zcard(keys.results))
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    warmup = max(30.0, seconds / 3) if seconds >= 90 else seconds / 3
    return {
        "queue": queue,
        "offered_rate": rate,
        "minutes": minutes,
        "offered": state["offered"],
        "achieved_offer_rate": round(state["offered"] / elapsed),
        "backlog_after_drain": backlog_end,
        "results_index_at_end": completed,
        "warmup_s": warmup,
        "samples": samples,
        "summary": summarise(samples, warmup),
    }


def _table(res: dict[str, Any]) -> str:
    s = res["summary"]
    lines = [
        f"soak: {res['offered']} jobs offered at {res['achieved_offer_rate']}/s (target {res['offered_rate']}/s) "
        f"for {res['minutes']} min; steady state from t={s['steady_from_s']} s ({s['steady_samples']} samples)",
        f"{'metric':<19} {'first third':>14} {'last third':>14} {'change':>8} {'slope/min':>12} {'max':>14}",
    ]
    for m in METRICS:
        v = s[m]
        lines.append(
            f"{m:<19} {v['first_third']:>14,} {v['last_third']:>14,} {v['change_pct']:>7}% "
            f"{v['slope_per_min']:>12,} {v['max']:>14,}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=3000, help="offered jobs/s (default 3000)")
    ap.add_argument("--minutes", type=float, default=3.0, help="how long to offer (default 3)")
    ap.add_argument("--interval", type=float, default=None, help="seconds between samples (default: run/36, 1..5)")
    ap.add_argument("--redis-url", default=None, help="use this server instead of a private redis-server")
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    interval = args.interval or min(5.0, max(1.0, args.minutes * 60 / 36))
    facts = machine()  # the load average before the run
    with private_redis(args.redis_url) as url:
        res = asyncio.run(soak(url, args.rate, args.minutes, interval))
        res["meta"] = {"redis_version": redis_version(url), "private_server": args.redis_url is None, **facts}
    write_json(args.out, res)
    print(_table(res))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
