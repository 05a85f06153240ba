"""FCALL of the Redis Functions library against EVALSHA of the same script (issue 13).

    python benchmarks/bench_functions.py                  # 40 blocks of 10 calls per command
    python benchmarks/bench_functions.py --redis-url redis://127.0.0.1:6379/0

One ``enqueue_batch`` call of 1,000 pre-encoded jobs, sent both ways on one private Redis
(or ``--redis-url``), in alternating blocks so that load drifts hit both alike:

* client: what the lane does per call, ``engine/_wire.py``'s ``pack_call`` (best of 7);
* server: Redis's own time per call (``INFO commandstats`` usec / calls, reset per block),
  median over the blocks.

Prints both and writes ``benchmarks/results/functions.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import RESULTS, log, machine, private_redis, redis_version, write_json

from airflow_provider_chasqui.core.calls import script_call
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.core.scripts import LIBRARY, SCRIPTS
from airflow_provider_chasqui.engine._wire import pack_call

QUEUE = "bench-functions"


def measure(url: str, blocks: int, per_block: int, jobs: int) -> dict[str, Any]:
    core = ProducerCore(QUEUE)
    stream = core.keys.stream
    argv: list[Any] = [1_000_000]
    for i in range(jobs):
        job = core.prepare("noop", {"i": i})
        argv += (job.envelope, job.name_bytes)
    call = script_call("enqueue_batch", (stream,), argv)
    out: dict[str, Any] = {"jobs_per_call": jobs}
    for name, functions in (("EVALSHA", False), ("FCALL", True)):
        best = min(timeit.repeat(lambda functions=functions: pack_call(call, functions), number=500, repeat=7)) / 500
        out[f"pack_us_{name.lower()}"] = round(best * 1e6, 1)
    script = SCRIPTS["enqueue_batch"]
    per_call: dict[str, list[float]] = {"EVALSHA": [], "FCALL": []}
    with redis.Redis.from_url(url) as r:
        try:
            r.execute_command("FUNCTION", "LOAD", LIBRARY.source)
        except redis.ResponseError as exc:
            if "already exists" not in str(exc):
                raise
        r.script_load(script.body)
        for block in range(blocks):
            for name in ("EVALSHA", "FCALL") if block % 2 else ("FCALL", "EVALSHA"):
                head = ("EVALSHA", script.sha) if name == "EVALSHA" else ("FCALL", script.function)
                r.execute_command("CONFIG", "RESETSTAT")
                pipe = r.pipeline(transaction=False)
                for _ in range(per_block):
                    pipe.execute_command(*head, 1, stream, *argv)
                pipe.execute()
                stat = r.info("commandstats")[f"cmdstat_{name.lower()}"]
                per_call[name].append(stat["usec"] / stat["calls"])
                r.delete(stream)
    for name, values in per_call.items():
        out[f"server_us_{name.lower()}"] = round(statistics.median(values), 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=40, help="alternating blocks per command (default 40)")
    ap.add_argument("--per-block", type=int, default=10, help="calls per block (default 10)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per call (default 1,000)")
    ap.add_argument("--redis-url", default=None, help="use this server instead of a private one")
    ap.add_argument("--out", default=str(RESULTS / "functions.json"))
    args = ap.parse_args(argv)
    with private_redis(args.redis_url) as url:
        result = measure(url, args.blocks, args.per_block, args.jobs)
        data = {"meta": {**machine(), "redis": redis_version(url)}, "results": result}
    log(f"pack per call: EVALSHA {result['pack_us_evalsha']} us, FCALL {result['pack_us_fcall']} us")
    log(f"Redis per call (median): EVALSHA {result['server_us_evalsha']} us, FCALL {result['server_us_fcall']} us")
    write_json(Path(args.out), data)
    return data


if __name__ == "__main__":
    main()
