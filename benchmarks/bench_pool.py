"""Process pools (issue 25): what ``--processes N`` buys for CPU-bound handlers and what it
costs a no-op job.

Each run is a fresh worker process (``Worker(..., processes=P)``, or in process when P is 0)
draining a queue filled beforehand with ``--jobs`` jobs of one handler
(``benchmarks/_pool_handlers.py``): ``burn`` (about 5 ms of pure Python holding the GIL),
``noop`` (a plain function) or ``anoop`` (an ``async def``).  The rate is the jobs over the
span from the first ``active`` event to the last ``completed`` one (Redis' clock), so the
pool's start-up is not counted; CPU per job is the worker's and its children's over the same
span (``/proc``).  Configurations alternate (A B A B ...) ``--repeats`` times; medians.

    python benchmarks/bench_pool.py                    # burn 0/1/2 processes; noop and anoop 0/2
    python benchmarks/bench_pool.py --repeats 5 --jobs 400,40000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, machine, private_redis, queue_events, write_json

from airflow_provider_chasqui import SyncQueue

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNNER = """
import asyncio, json, os, sys
sys.path[:0] = [sys.argv[5], sys.argv[6]]
import _pool_handlers as handlers
from airflow_provider_chasqui import Worker

TICK = os.sysconf("SC_CLK_TCK")

def cpu(pids):
    total = sum(os.times()[:2])
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return total

async def main():
    url, queue, name, procs, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[7])
    worker = Worker(queue, {name: getattr(handlers, name)}, redis_url=url, processes=procs or None,
                    run_scheduler=False, read_block_ms=200, max_jobs=n, events_max_stream_len=10_000_000)
    task = asyncio.ensure_future(worker.run())
    while worker.processed == 0 and not task.done():
        await asyncio.sleep(0.001)
    pids = worker._procs.pids() if worker._procs is not None else []
    first = cpu(pids)
    while worker.processed < n and not task.done():
        await asyncio.sleep(0.001)
    last = cpu(pids)
    await task
    print(json.dumps({"cpu_s": last - first, "jobs_counted": n}))

if __name__ == "__main__":
    asyncio.run(main())
"""


def one(url: str, handler: str, procs: int, n: int) -> dict[str, Any]:
    queue = f"bench-pool-{uuid.uuid4().hex[:8]}"
    with SyncQueue(queue, redis_url=url) as q:
        for c in range(0, n, 10_000):
            q.add_bulk([{"name": handler, "data": None} for _ in range(c, min(n, c + 10_000))])
        out = subprocess.run(
            [sys.executable, "-c", RUNNER, url, queue, handler, str(procs), str(HERE), str(HERE.parent), str(n)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
        measured = json.loads(out.strip().splitlines()[-1])
        first_active = last_completed = None
        for ms, fields in queue_events(url, queue):
            if fields.get(b"e") == b"active" and first_active is None:
                first_active = ms
            elif fields.get(b"e") == b"completed":
                last_completed = ms
        q.obliterate(force=True)
    assert first_active is not None and last_completed is not None
    seconds = max(0.001, (last_completed - first_active) / 1000)
    return {"rate": n / seconds, "cpu_us_per_job": measured["cpu_s"] / n * 1e6}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="400,40000", help="jobs per run: CPU-bound,no-op")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--out", default=str(RESULTS / "pool.json"))
    args = ap.parse_args(argv)
    burn_n, noop_n = (int(x) for x in args.jobs.split(","))
    configs = [("burn", 0, burn_n), ("burn", 1, burn_n), ("burn", 2, burn_n)]
    configs += [("noop", 0, noop_n), ("noop", 2, noop_n), ("anoop", 0, noop_n), ("anoop", 2, noop_n)]
    runs: dict[str, list[dict[str, Any]]] = {f"{h}/{p}": [] for h, p, _n in configs}
    with private_redis(args.redis_url) as url:
        for rep in range(args.repeats):
            for handler, procs, n in configs:
                res = one(url, handler, procs, n)
                runs[f"{handler}/{procs}"].append(res)
                log(
                    f"run {rep + 1}: {handler:<5} processes={procs}: {res['rate']:,.0f} jobs/s, "
                    f"{res['cpu_us_per_job']:.1f} us CPU/job"
                )
    med = {
        key: {
            "rate": statistics.median(r["rate"] for r in rs),
            "cpu_us_per_job": statistics.median(r["cpu_us_per_job"] for r in rs),
        }
        for key, rs in runs.items()
    }
    ratios = {
        "burn: 2 processes / in process": med["burn/2"]["rate"] / med["burn/0"]["rate"],
        "burn: 2 processes / 1 process": med["burn/2"]["rate"] / med["burn/1"]["rate"],
        "noop (plain): time per job, pool / in process": med["noop/0"]["rate"] / med["noop/2"]["rate"],
        "anoop (async): time per job, pool / in process": med["anoop/0"]["rate"] / med["anoop/2"]["rate"],
    }
    print(f"{'handler/processes':<18} {'jobs/s':>10} {'CPU us/job':>11}")
    for key, m in med.items():
        print(f"{key:<18} {m['rate']:>10,.0f} {m['cpu_us_per_job']:>11.1f}")
    for label, value in ratios.items():
        print(f"{label}: {value:.2f}")
    result = {"machine": machine(), "medians": med, "ratios": ratios, "runs": runs, "repeats": args.repeats}
    write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
