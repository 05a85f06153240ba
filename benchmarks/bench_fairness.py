"""Fairness of job groups (issue 24): one big group's backlog against many small groups.

A private ``redis-server`` (or ``--redis-url``); group "big" gets ``--big`` jobs first (100,000),
then ``--groups`` small groups (100) get ``--per-group`` jobs each (10).  One in-process
``Worker`` (concurrency 20, a no-op async handler) drains until every small group's job has
started.  Reported, from the moment the last add returned: the wait of the small groups' jobs
(p50, p99, max), how many "big" jobs started before the last small job (the issue's bound is
2,000), the wait of the first 2,000 "big" jobs, and the grouped throughput.

    python benchmarks/bench_fairness.py                 # 100,000 + 100 x 10
    python benchmarks/bench_fairness.py --big 20000     # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, private_redis, write_json

from airflow_provider_chasqui import Queue, Worker

RESULTS = Path(__file__).resolve().parent / "results"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(url: str, big: int, groups: int, per_group: int) -> dict[str, Any]:
    name = f"bench-fair-{uuid.uuid4().hex[:8]}"
    small = groups * per_group
    started: list[tuple[float, bool]] = []  # (monotonic start, is a small group's job)
    done = asyncio.Event()
    seen_small = 0

    async def handler(job: Any) -> None:
        nonlocal seen_small
        is_small = job.data["g"] != "big"
        started.append((time.monotonic(), is_small))
        if is_small:
            seen_small += 1
            if seen_small >= small:
                done.set()

    async with Queue(name, redis_url=url) as q:
        for c in range(0, big, 10_000):
            await q.add_bulk(
                [{"name": "j", "data": {"g": "big"}, "group": "big"} for _ in range(c, min(big, c + 10_000))]
            )
        await q.add_bulk(
            [{"name": "j", "data": {"g": f"t{k}"}, "group": f"t{k}"} for _ in range(per_group) for k in range(groups)]
        )
        t0 = time.monotonic()
        worker = Worker(name, handler, redis_url=url, concurrency=20, run_scheduler=False)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(done.wait(), 600)
        finally:
            await worker.close()
            await asyncio.wait_for(task, 60)
        seconds = time.monotonic() - t0
        await q.obliterate(force=True)
    last_small = max(i for i, (_t, s) in enumerate(started) if s)
    small_waits = [(t - t0) * 1000 for t, s in started if s]
    big_waits = [(t - t0) * 1000 for t, s in started if not s][:2000]
    return {
        "big": big,
        "groups": groups,
        "per_group": per_group,
        "big_started_before_last_small": sum(1 for _t, s in started[:last_small] if not s),
        "small_wait_ms": {
            "p50": _pct(small_waits, 0.5),
            "p99": _pct(small_waits, 0.99),
            "max": max(small_waits),
        },
        "big_first_2000_wait_ms": {"p50": _pct(big_waits, 0.5), "p99": _pct(big_waits, 0.99)} if big_waits else None,
        "jobs_started": len(started),
        "jobs_per_s": len(started) / seconds,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--per-group", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--out", default=str(RESULTS / "fairness.json"))
    args = ap.parse_args(argv)
    runs = []
    with private_redis(args.redis_url) as url:
        for i in range(args.repeats):
            res = asyncio.run(run(url, args.big, args.groups, args.per_group))
            log(
                f"[{i + 1}/{args.repeats}] big jobs before the last small one: {res['big_started_before_last_small']}, "
                f"small waits p50 {res['small_wait_ms']['p50']:.0f} ms p99 {res['small_wait_ms']['p99']:.0f} ms, "
                f"{res['jobs_per_s']:,.0f} jobs/s"
            )
            runs.append(res)
    summary = {
        "big_started_before_last_small_median": statistics.median(r["big_started_before_last_small"] for r in runs),
        "small_wait_p50_ms_median": statistics.median(r["small_wait_ms"]["p50"] for r in runs),
        "small_wait_p99_ms_median": statistics.median(r["small_wait_ms"]["p99"] for r in runs),
        "jobs_per_s_median": statistics.median(r["jobs_per_s"] for r in runs),
        "bound": 2000,
    }
    print(summary)
    write_json(Path(args.out), {"runs": runs, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
