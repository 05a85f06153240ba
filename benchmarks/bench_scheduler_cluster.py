"""Repeatable specs on a Redis Cluster: N specs over a 3-master cluster, per shard (issue 27).

    python benchmarks/bench_scheduler_cluster.py                 # 3,000,000 specs; 100,000 fires
    python benchmarks/bench_scheduler_cluster.py --smoke         # 30,000 specs; 3,000 fires

A private cluster of three masters (``redis-server --cluster-enabled``, no replicas, no
persistence, free loopback ports) is started and stopped by pid.  The specs go to a
``SyncShardedQueue`` of three shards whose hash tags sit on three different masters (the
queue name is chosen so), written a call of 10,000 at a time (client memory bounded).  Then a
burst of F specs due at the same second, among the N, is fired by three in-process
``Scheduler`` loops, one per shard (each shard elects its own leader, so shards fire in
parallel).  Per shard: specs, memory per spec (``INFO used_memory`` of its master), Redis CPU
per spec, fires, fires/s and lag; overall: the upsert rate and the burst's fires/s.  Writes
``benchmarks/results/scheduler-cluster.json`` (``--out`` to change).  BENCHMARKS.md projects
these figures to 30M specs.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import RESULTS, log, machine, private_cluster, write_json
from bench_scheduler import CALL, cron_at, pct, read_fires, spec_items

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.sharding import shard_queue_names
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue

SHARDS = 3


def _node_of(rc: redis.RedisCluster, key: str) -> int:
    return int(rc.get_node_from_key(key).port)


def pick_queue(rc: redis.RedisCluster) -> tuple[str, list[int]]:
    """A queue name whose shards' hash tags sit on ``SHARDS`` different masters."""
    for i in range(1000):
        name = f"bench-sched-{i}"
        ports = [_node_of(rc, QueueKeys.for_queue(n).repeat) for n in shard_queue_names(name, SHARDS)]
        if len(set(ports)) == SHARDS:
            return name, ports
    raise SystemExit("no queue name spreads its shards over every master")


def node_stats(ports: list[int]) -> dict[int, tuple[int, float]]:
    """Per master: (used_memory, CPU seconds)."""
    out = {}
    for port in ports:
        with redis.Redis(port=port) as r:
            mem = int(r.info("memory")["used_memory"])
            cpu = r.info("cpu")
            out[port] = (mem, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))
    return out


def upsert(url: str, name: str, n: int) -> float:
    with SyncShardedQueue(name, SHARDS, redis_url=url) as q:
        t0 = time.perf_counter()
        for i in range(0, n, CALL):
            q.upsert_repeatable_bulk(spec_items(i, min(n, i + CALL)))
        return time.perf_counter() - t0


def burst(url: str, name: str, f: int, lead_s: float) -> dict[str, Any]:
    now = time.time_ns() // 1_000_000
    t = (now // 1000 + int(lead_s) + 1) * 1000
    pattern = cron_at(t)
    with SyncShardedQueue(name, SHARDS, redis_url=url) as q:
        for i in range(0, f, CALL):
            q.upsert_repeatable_bulk(
                [
                    {"name": "fire", "data": {"i": j}, "key": f"f{j:07}", "repeat": pattern}
                    for j in range(i, min(f, i + CALL))
                ]
            )
    if time.time_ns() // 1_000_000 > t - 200:
        raise SystemExit(f"upserting {f} fire specs took too long for the lead of {lead_s}s; raise --lead")
    names = shard_queue_names(name, SHARDS)
    rc = redis.RedisCluster.from_url(url.split("?")[0])
    streams = [QueueKeys.for_queue(n).stream for n in names]

    async def run() -> float:
        drivers = [AsyncDriver(url) for _ in names]
        scheds = [Scheduler(d, n, tick_ms=1000) for d, n in zip(drivers, names)]
        tasks = [asyncio.create_task(s.run()) for s in scheds]
        await asyncio.sleep(max(0.0, (t - 50) / 1000 - time.time()))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        end = time.monotonic() + 120
        while sum(rc.xlen(s) for s in streams) < f and time.monotonic() < end:
            await asyncio.sleep(0.05)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        for s in scheds:
            s.stop()
        await asyncio.gather(*tasks)
        for d in drivers:
            await d.close()
        return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime

    cpu = asyncio.run(run())
    shards = []
    last_all = t
    for n, stream in zip(names, streams):
        got = read_fires(rc, stream)  # type: ignore[arg-type]
        lags = [e - s for e, s in got]
        last = max((e for e, _s in got), default=t)
        last_all = max(last_all, last)
        shards.append(
            {
                "queue": n,
                "fires": len(got),
                "fires_per_s": len(got) / max(0.001, (last - t) / 1000),
                "lag_p50_ms": pct(lags, 0.5),
                "lag_p99_ms": pct(lags, 0.99),
            }
        )
    rc.close()
    total = sum(s["fires"] for s in shards)
    assert total == f, f"{total} fires of {f}"
    return {
        "fires": f,
        "fires_per_s": f / max(0.001, (last_all - t) / 1000),
        "drain_seconds": (last_all - t) / 1000,
        "client_cpu_us_per_fire": cpu / f * 1e6,
        "shards": shards,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="30,000 specs and 3,000 fires")
    ap.add_argument("--specs", type=int, default=None)
    ap.add_argument("--fires", type=int, default=None)
    ap.add_argument("--lead", type=float, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n = args.specs or (30_000 if args.smoke else 3_000_000)
    f = args.fires or (3_000 if args.smoke else 100_000)
    out_path = (
        Path(args.out)
        if args.out
        else RESULTS / ("scheduler-cluster-smoke.json" if args.smoke else "scheduler-cluster.json")
    )
    with private_cluster(SHARDS) as nodes:
        ports = list(nodes)
        url = f"redis://127.0.0.1:{ports[0]}/0?cluster=true"
        with redis.RedisCluster(host="127.0.0.1", port=ports[0]) as rc:
            name, shard_ports = pick_queue(rc)
        log(f"cluster on {ports}; queue {name}, shards on {shard_ports}; {n:,} specs, {f:,} fires")
        before = node_stats(ports)
        wall = upsert(url, name, n)
        after = node_stats(ports)
        with redis.RedisCluster(host="127.0.0.1", port=ports[0]) as rc:
            counts = [int(rc.zcard(QueueKeys.for_queue(q).repeat)) for q in shard_queue_names(name, SHARDS)]
        assert sum(counts) == n, counts
        lead = args.lead or max(3.0, 2 + 2 * f / (n / wall))
        log(f"upserted in {wall:.1f}s; burst due {lead:.0f}s after its upsert starts ...")
        fired = burst(url, name, f, lead)
    shard_rows = []
    for i, port in enumerate(shard_ports):
        mem = after[port][0] - before[port][0]
        cpu = after[port][1] - before[port][1]
        shard_rows.append(
            {
                "shard": i,
                "port": port,
                "specs": counts[i],
                "bytes_per_spec": mem / max(1, counts[i]),
                "redis_cpu_us_per_spec": cpu / max(1, counts[i]) * 1e6,
                **{k: v for k, v in fired["shards"][i].items() if k != "queue"},
            }
        )
    result = {
        "benchmark": "scheduler-cluster",
        "mode": "smoke" if args.smoke else "full",
        "masters": SHARDS,
        "machine": machine(),
        "specs": n,
        "upsert_specs_per_s": n / wall,
        "upsert_seconds": wall,
        "client_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "burst": {k: v for k, v in fired.items() if k != "shards"},
        "shards": shard_rows,
    }
    write_json(out_path, result)
    print(f"{n:,} specs on {SHARDS} masters: upsert {n / wall:,.0f} specs/s; burst {fired['fires_per_s']:,.0f} fires/s")
    for row in shard_rows:
        print(
            f"  shard {row['shard']} ({row['specs']:,} specs): {row['bytes_per_spec']:.0f} B/spec, "
            f"Redis {row['redis_cpu_us_per_spec']:.1f} us/spec; {row['fires']:,} fires at "
            f"{row['fires_per_s']:,.0f}/s, lag p50 {row['lag_p50_ms']} ms, p99 {row['lag_p99_ms']} ms"
        )
    print(f"client peak RSS {result['client_peak_rss_mb']:.0f} MB; wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
