"""What a retry costs, step by step (issue 27): the worker's CPU and Redis' time per job.

    python benchmarks/bench_retry.py                 # N=20,000, median of 3 (about a minute)
    python benchmarks/bench_retry.py --smoke         # N=500, one run

Three end-to-end runs of ``bench_engine.py``'s worker process (concurrency 50, events on) on one
private Redis, N jobs each:

* ``plain``: jobs with no retry override, the handler returns (= ``e2e_process``);
* ``override``: the same jobs carrying a retry override (``attempts=2, backoff=0``), the handler
  returns: what decoding an override costs the worker;
* ``retry``: those jobs, the handler fails each one's first attempt (= ``e2e_retry``).

Then one more ``retry`` run with Redis' slow log recording every command (threshold 0), which
splits Redis' time per job into the steps of a retried job: the two reads (``XREADGROUP``), the
two ``active`` events (``emit_events``), the failure (``fail_batch``: ack, delayed-set entry,
``failed`` and ``retry-scheduled`` events), the promotion (``promote``: back into the stream,
``waiting`` event) and the success (``complete_batch``).  The slow log's own cost inflates those
figures alike; read them as shares.  Results: ``benchmarks/results/retry.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import RESULTS, log, machine, median_of, private_redis, redis_version, write_json
from bench_engine import _cleanup, _event_span, _fill, _queue_name, _redis_cpu, _run_worker

STEPS = ("XREADGROUP", "emit_events", "fail_batch", "promote", "complete_batch")


def _run(url: str, n: int, mode: str) -> dict[str, Any]:
    qn = _queue_name(f"rt{mode[:3]}")
    try:
        _fill(url, qn, n, fail_first=mode != "plain")
        deliveries = 2 * n if mode == "retry" else n
        cpu0 = _redis_cpu(url)
        worker = _run_worker(
            url, qn, deliveries, "fail_first" if mode == "retry" else "noop", 8 * n, False, timeout=120 + n / 500
        )
        redis_cpu = _redis_cpu(url) - cpu0
        span = _event_span(url, qn, "active")
        if span["completed_events"] < n or span["first_ms"] is None or span["last_ms"] is None:
            raise RuntimeError(f"{mode}: events incomplete: {span}")
        seconds = max(span["last_ms"] - span["first_ms"], 1) / 1000
        return {
            "jobs_per_s": n / seconds,
            "worker_cpu_us_per_job": worker["cpu_s"] / n * 1e6,
            "redis_cpu_us_per_job": redis_cpu / n * 1e6,
        }
    finally:
        _cleanup(url, qn)


def _steps(url: str, n: int) -> dict[str, float]:
    """Redis microseconds per job of each step of a retried job, from the slow log."""
    r = redis.Redis.from_url(url)
    old = r.config_get("slowlog-*")
    try:
        r.config_set("slowlog-max-len", 20 * n + 10_000)
        r.config_set("slowlog-log-slower-than", 0)
        r.slowlog_reset()
        _run(url, n, "retry")
        total: collections.Counter[str] = collections.Counter()
        for entry in r.slowlog_get(20 * n + 10_000):
            words = entry["command"].split()
            cmd = words[0].decode().upper() if isinstance(words[0], bytes) else str(words[0]).upper()
            if cmd in ("FCALL", "EVALSHA", "FCALL_RO") and len(words) > 1:
                fn = words[1].decode() if isinstance(words[1], bytes) else str(words[1])
                cmd = next((s for s in STEPS if fn.endswith("_" + s)), fn)
            if cmd in STEPS:
                total[cmd] += entry["duration"]
        return {step: total[step] / n for step in STEPS}
    finally:
        r.config_set("slowlog-log-slower-than", old.get("slowlog-log-slower-than", "10000"))
        r.config_set("slowlog-max-len", old.get("slowlog-max-len", "128"))
        r.slowlog_reset()
        r.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="N=500, one run")
    ap.add_argument("--redis-url")
    ap.add_argument("--out", default=str(RESULTS / "retry.json"))
    args = ap.parse_args(argv)
    n, repeats = (500, 1) if args.smoke else (args.n, args.repeats)
    with private_redis(args.redis_url) as url:
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in ("plain", "override", "retry")}
        for i in range(repeats):
            for mode in runs:  # interleaved, so a noisy neighbour hits all alike
                runs[mode].append(_run(url, n, mode))
                log(f"[{i + 1}/{repeats}] {mode}: {runs[mode][-1]['jobs_per_s']:,.0f} jobs/s")
        figures = {mode: median_of(rs) for mode, rs in runs.items()}
        steps = _steps(url, n)
        out = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(),
            "redis": redis_version(url),
            "n": n,
            "repeats": repeats,
            "figures": figures,
            "retry_over_plain": figures["retry"]["jobs_per_s"] / figures["plain"]["jobs_per_s"],
            "redis_us_per_job_by_step": steps,
        }
    for mode, f in figures.items():
        print(
            f"{mode:9s} {f['jobs_per_s']:>9,.0f} jobs/s  worker {f['worker_cpu_us_per_job']:5.1f} us/job"
            f"  Redis {f['redis_cpu_us_per_job']:5.1f} us/job"
        )
    print(f"retry / plain: {out['retry_over_plain']:.2f}x (issue 27 asks >= 0.5x)")
    print("Redis per retried job, by step (slow log on): " + ", ".join(f"{k} {v:.1f} us" for k, v in steps.items()))
    write_json(Path(args.out), out)
    return out


if __name__ == "__main__":
    main()
