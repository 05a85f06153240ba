"""Dashboard page response times on a big queue: 1,000,000 waiting jobs and 1,000,000 specs.

    python benchmarks/bench_dashboard.py            # 1M jobs + 1M specs (a few minutes to seed)
    python benchmarks/bench_dashboard.py --smoke    # 20,000 + 20,000 (seconds)

A private ``redis-server`` is started on a free loopback port and stopped by its pid at the end
(``--redis-url`` reuses an empty server).  Seeding uses the engine's bulk paths:
``SyncQueue.add_bulk`` for the jobs (calls of 10,000) and ``upsert_repeatable_bulk`` for the
specs (every-N-minutes patterns, explicit keys ``spec-0000000``...).  The rest of a busy queue
is written with the wire layout directly, as workers would leave it: a consumer group with 100
delivered (pending) entries, 5,000 ``completed``/``failed`` events of the last minutes and
10,000 DLQ entries (two reasons, two names).

Then ``chasqui dashboard`` runs as a real process and each page is fetched ``--repeat`` times
over HTTP (after one warm-up): median, p95 and max in ms, against the ~200 ms target.  The
queue scan (a cursor SCAN of every key: 2M+ here) runs in the background; its duration is
reported separately, pages never wait for it more than 150 ms.  Prints a table and writes
``benchmarks/results/dashboard.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from _common import RESULTS, free_port, log, machine, private_redis, redis_version, write_json  # noqa: E402

from airflow_provider_chasqui.core.codec import encode_data, encode_new_envelope, new_job_id, now_ms  # noqa: E402
from airflow_provider_chasqui.core.keys import QueueKeys  # noqa: E402
from airflow_provider_chasqui.core.repeat import RepeatPattern  # noqa: E402
from airflow_provider_chasqui.sync.queue import SyncQueue  # noqa: E402

QUEUE = "bench-dash"
TARGET_MS = 200.0


def seed(url: str, jobs: int, specs: int) -> dict[str, float]:
    timings: dict[str, float] = {}
    q = SyncQueue(QUEUE, redis_url=url, max_stream_len=max(jobs * 2, 1000))
    started = time.perf_counter()
    middle = None
    for start in range(0, jobs, 10_000):
        n = min(10_000, jobs - start)
        added = q.add_bulk([{"name": "report", "data": {"row": start + i, "pad": "x" * 60}} for i in range(n)])
        if start <= jobs // 2 < start + n:
            middle = added[jobs // 2 - start].id
    timings["seed_jobs_s"] = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, specs, 10_000):
        n = min(10_000, specs - start)
        q.upsert_repeatable_bulk(
            [
                {
                    "name": "tick",
                    "data": {"spec": start + i},
                    "repeat": RepeatPattern.every(60_000 * (1 + (start + i) % 60)),
                    "key": f"spec-{start + i:07d}",
                }
                for i in range(n)
            ]
        )
    timings["seed_specs_s"] = time.perf_counter() - started
    k = QueueKeys.for_queue(QUEUE)
    r = redis.Redis.from_url(url)
    r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    r.xreadgroup("default", "bench-worker-1", {k.stream: ">"}, count=100)
    pipe = r.pipeline(transaction=False)
    now = now_ms()
    for i in range(5000):
        pipe.xadd(k.events, {"e": "completed" if i % 10 else "failed", "id": new_job_id(), "ts": now - i * 50})
    for i in range(10_000):
        jid = new_job_id()
        env = encode_new_envelope(jid, encode_data({"dead": i}), now)
        pipe.xadd(
            k.dlq,
            {
                "d": env,
                "n": "report" if i % 2 else "export",
                "reason": "unrecoverable" if i % 3 else "retries_exhausted",
                "source_id": f"{now}-{i}",
            },
        )
    pipe.execute()
    dlq_first = r.xrange(k.dlq, count=1)[0][0].decode()
    r.close()
    q.close()
    return {**timings, "middle_job": middle, "dlq_first": dlq_first}  # type: ignore[dict-item]


def fetch(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as resp:
        resp.read()
        assert resp.status == 200, url
    return (time.perf_counter() - started) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="20,000 jobs and 20,000 specs")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--specs", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None, help="fetches per page (default 20; 5 in smoke mode)")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    jobs = args.jobs or (20_000 if args.smoke else 1_000_000)
    specs = args.specs or (20_000 if args.smoke else 1_000_000)
    repeat = args.repeat or (5 if args.smoke else 20)
    out_path = Path(args.out) if args.out else RESULTS / "dashboard.json"
    with private_redis(args.redis_url) as url:
        log(f"seeding {jobs:,} jobs and {specs:,} specs on {url}")
        seeded = seed(url, jobs, specs)
        log(f"seeded: jobs {seeded['seed_jobs_s']:.1f} s, specs {seeded['seed_specs_s']:.1f} s")
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "dashboard",
                "--redis-url",
                url,
                "--port",
                str(port),
                "--log-level",
                "WARNING",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    fetch(base + "/static/dashboard.css")
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the dashboard did not start") from None
                    time.sleep(0.2)
            scan_started = time.perf_counter()
            fetch(base + "/api/queues")
            while json.loads(urllib.request.urlopen(base + "/api/queues", timeout=60).read())["scan"]["scanning"]:
                time.sleep(0.2)
            scan_s = time.perf_counter() - scan_started
            log(f"queue scan of every key: {scan_s:.1f} s (in the background)")
            q = f"queue={QUEUE}"
            pages = {
                "queues": "/",
                "queue": f"/queue?{q}",
                "job (middle of 1M)": f"/job?{q}&id={seeded['middle_job']}",
                "dlq first page": f"/dlq?{q}",
                "dlq filtered": f"/dlq?{q}&reason=retries_exhausted&name=export",
                "dlq entry": f"/dlq/entry?{q}&id={seeded['dlq_first']}",
                "schedules first page": f"/schedules?{q}",
                "schedules next page": f"/schedules?{q}&cursor=r:1000",
                "schedules prefix": f"/schedules?{q}&prefix=spec-05",
                "workers": f"/workers?{q}",
                "api/queues": "/api/queues",
            }
            rows = {}
            for name, path in pages.items():
                fetch(base + path)
                times = sorted(fetch(base + path) for _ in range(repeat))
                rows[name] = {
                    "median_ms": statistics.median(times),
                    "p95_ms": times[max(0, int(len(times) * 0.95) - 1)],
                    "max_ms": times[-1],
                    "path": path,
                }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        result = {
            "jobs": jobs,
            "specs": specs,
            "repeat": repeat,
            "seed": seeded,
            "scan_s": scan_s,
            "target_ms": TARGET_MS,
            "pages": rows,
            "redis": redis_version(url),
            "machine": machine(),
        }
    print(f"\n{'page':24} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    for name, r in rows.items():
        flag = "" if r["median_ms"] <= TARGET_MS else "  over target"
        print(f"{name:24} {r['median_ms']:10.1f} {r['p95_ms']:8.1f} {r['max_ms']:8.1f}{flag}")
    write_json(out_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
