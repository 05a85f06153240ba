"""A master's loss under sharded schedulers: failover on a 3-master cluster with replicas (issue 27).

    python benchmarks/bench_cluster_failover.py            # 300,000 daily specs, 3,000 firing every second
    python benchmarks/bench_cluster_failover.py --smoke    # 3,000 daily specs, 300 firing every second

A private cluster of three masters, each with one replica (``cluster-node-timeout`` 5,000 ms,
no persistence, free loopback ports, stopped by pid) holds a ``SyncShardedQueue`` of three
shards whose hash tags sit on the three masters.  N daily specs sit beside T specs that fire
every second, spread over the shards, fired by three ``Scheduler`` loops (one per shard, in
one process, as in ``bench_scheduler_cluster.py``).  A monitor thread reads every fire from
the shards' streams as it lands.  After a warm-up the master of shard 0 is killed (SIGKILL)
and the run goes on until that shard has fired again for ``--after`` seconds.  Measured:

* **promotion**: from the kill until the dead master's replica answers ``ROLE`` as master;
* **the shard's fire gap**: its last fire before the kill to its first one after;
* its **windows** due while it was down: fired late, or skipped (the specs' ``missed_fires``
  policy; the default skips), and **fires seen twice** (one job id in two stream entries):
  a fire is a compare-and-set, but replication is asynchronous, so a fire the dead master
  acknowledged and had not yet sent to its replica is lost with it and its window can fire
  again on the promoted replica;
* **the other shards**: their fire lag (entry time minus scheduled time) p99 before and
  during the failover, and their longest pause between fires.

Writes ``benchmarks/results/cluster-failover.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgpack
import redis
from _common import RESULTS, log, machine, private_cluster, write_json
from bench_scheduler import CALL, pct, spec_items
from bench_scheduler_cluster import SHARDS, pick_queue

from airflow_provider_chasqui import RepeatPattern
from airflow_provider_chasqui.core.codec import decode_envelope, ulid_ms
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.sharding import shard_queue_names
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue

EVERY_MS = 1000
NODE_TIMEOUT_MS = 5000


class Monitor(threading.Thread):
    """Reads every shard's new fires every 50 ms: (entry ms, scheduled ms, job id, spec) per shard.
    A shard whose master is down is skipped until its replica answers."""

    def __init__(self, url: str, streams: list[str]) -> None:
        super().__init__(daemon=True)
        self.rc = redis.RedisCluster.from_url(url.split("?")[0], socket_timeout=2)
        self.streams = streams
        self.fires: list[list[tuple[int, int, str, int]]] = [[] for _ in streams]
        self.cursor = ["-"] * len(streams)
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for i, stream in enumerate(self.streams):
                try:
                    self._read(i, stream)
                except redis.RedisError:  # the dead shard until its replica is promoted
                    self.errors += 1
            self.stop.wait(0.05)

    def _read(self, i: int, stream: str) -> None:
        while True:
            rows = self.rc.xrange(stream, self.cursor[i], "+", count=10_000)
            if not rows:
                return
            for eid, fields in rows:
                env = decode_envelope(fields[b"d"])
                scheduled = ulid_ms(env.id)  # a fire's id is a ULID of its scheduled time
                assert scheduled is not None
                spec = msgpack.unpackb(env.inner)["k"]
                self.fires[i].append((int(eid.split(b"-")[0]), scheduled, env.id, spec))
            self.cursor[i] = "(" + rows[-1][0].decode()


def replica_of(rc: redis.RedisCluster, master_port: int) -> int:
    nodes = rc.cluster_nodes()
    master_id = next(v["node_id"] for k, v in nodes.items() if k.endswith(f":{master_port}"))
    return next(int(k.rsplit(":", 1)[1]) for k, v in nodes.items() if v["master_id"] == master_id)


def wait_promoted(port: int, since: float, limit_s: float = 60.0) -> float:
    """Seconds from ``since`` until the node at ``port`` answers ROLE as a master."""
    with redis.Redis(port=port, socket_timeout=2) as r:
        while time.time() - since < limit_s:
            if r.execute_command("ROLE")[0] == b"master":
                return time.time() - since
            time.sleep(0.02)
    raise SystemExit(f"the replica on port {port} was not promoted within {limit_s}s")


def run(
    url: str, name: str, nodes: dict[int, Any], shard_ports: list[int], ticking: int, after_s: float
) -> dict[str, Any]:
    names = shard_queue_names(name, SHARDS)
    streams = [QueueKeys.for_queue(n).stream for n in names]
    with SyncShardedQueue(name, SHARDS, redis_url=url) as q:
        for i in range(0, ticking, CALL):
            q.upsert_repeatable_bulk(
                [
                    {"name": "tick", "data": {"k": j}, "key": f"tick{j:06}", "repeat": RepeatPattern.every(EVERY_MS)}
                    for j in range(i, min(ticking, i + CALL))
                ]
            )
    with redis.RedisCluster.from_url(url.split("?")[0]) as rc:
        per_shard = [int(rc.zcard(QueueKeys.for_queue(n).repeat)) for n in names]  # daily specs included
        replica = replica_of(rc, shard_ports[0])
    monitor = Monitor(url, streams)
    stop = threading.Event()
    loop_errors: list[BaseException] = []

    def schedulers() -> None:
        async def main() -> None:
            drivers = [AsyncDriver(url) for _ in names]
            scheds = [Scheduler(d, n, tick_ms=100) for d, n in zip(drivers, names)]
            tasks = [asyncio.create_task(s.run()) for s in scheds]
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for s in scheds:
                s.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            for d in drivers:
                await d.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            loop_errors.append(exc)

    thread = threading.Thread(target=schedulers, daemon=True)
    thread.start()
    monitor.start()
    warm = 4.0
    time.sleep(warm)
    t_kill = time.time()
    nodes[shard_ports[0]].send_signal(signal.SIGKILL)
    log(f"killed the master of shard 0 (port {shard_ports[0]}); its replica is on {replica}")
    promoted_s = wait_promoted(replica, t_kill)
    log(f"replica promoted {promoted_s:.2f}s after the kill")
    deadline = time.time() + 90
    while time.time() < deadline:
        back = [f for f in monitor.fires[0] if f[0] > t_kill * 1000]
        if back and time.time() * 1000 - back[0][0] > after_s * 1000:
            break
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    monitor.stop.set()
    monitor.join(10)
    if loop_errors:
        raise SystemExit(f"the scheduler loop died: {loop_errors[0]!r}")
    kill_ms = int(t_kill * 1000)
    dead = monitor.fires[0]
    before = [f for f in dead if f[0] <= kill_ms]
    after = [f for f in dead if f[0] > kill_ms]
    if not after:
        raise SystemExit("shard 0 never fired again after its master's loss")
    first_back = after[0][0]
    ids = collections.Counter(f[2] for fs in monitor.fires for f in fs)
    last_before = before[-1][0] if before else kill_ms
    last_scheduled: dict[int, int] = {}  # spec -> its last window fired before the kill
    for _e, sched, _id, spec in before:
        last_scheduled[spec] = max(sched, last_scheduled.get(spec, 0))
    caught_up = {(spec, sched) for _e, sched, _id, spec in after if sched <= first_back}
    windows = {
        (spec, s0 + k * EVERY_MS)
        for spec, s0 in last_scheduled.items()
        for k in range(1, 1 + (first_back - s0) // EVERY_MS)
    }
    late = [f for f in after if f[0] - f[1] > EVERY_MS]
    others: list[dict[str, Any]] = []
    for i in range(1, SHARDS):
        fs = monitor.fires[i]
        pre = [e - s for e, s, _, _ in fs if e <= kill_ms]
        during = [e - s for e, s, _, _ in fs if kill_ms < e <= first_back]
        times = sorted({e for e, _, _, _ in fs if kill_ms - 2000 <= e <= first_back})
        gap = max((b - a for a, b in zip(times, times[1:])), default=0)
        others.append(
            {
                "shard": i,
                "fires": len(fs),
                "lag_p99_before_ms": pct(pre, 0.99),
                "lag_p99_during_ms": pct(during, 0.99),
                "longest_pause_ms": gap,
            }
        )
    return {
        "ticking_specs": ticking,
        "ticking_per_shard": per_shard,
        "warm_up_s": warm,
        "promotion_s": round(promoted_s, 2),
        "shard0_fire_gap_s": round((first_back - last_before) / 1000, 2),
        "shard0_back_after_kill_s": round((first_back - kill_ms) / 1000, 2),
        "shard0_windows_in_gap": len(windows),
        "shard0_windows_fired_late": len(windows & caught_up),
        "shard0_windows_skipped": len(windows - caught_up),
        "shard0_late_fires": len(late),
        "fires_seen_twice": sum(1 for c in ids.values() if c > 1),
        "fires_total": sum(ids.values()),
        "monitor_read_errors": monitor.errors,
        "other_shards": others,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="3,000 daily specs, 300 firing every second")
    ap.add_argument("--specs", type=int, default=None, help="daily specs beside the ticking ones")
    ap.add_argument("--ticking", type=int, default=None, help="specs firing every second")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of fires after shard 0 is back")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n = args.specs if args.specs is not None else (3_000 if args.smoke else 300_000)
    ticking = args.ticking or (300 if args.smoke else 3_000)
    out_path = (
        Path(args.out)
        if args.out
        else RESULTS / ("cluster-failover-smoke.json" if args.smoke else "cluster-failover.json")
    )
    with private_cluster(SHARDS, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as nodes:
        masters = list(nodes)[:SHARDS]
        url = f"redis://127.0.0.1:{masters[0]}/0?cluster=true"
        with redis.RedisCluster(host="127.0.0.1", port=masters[0]) as rc:
            name, shard_ports = pick_queue(rc)
        log(f"cluster masters {masters}, replicas {list(nodes)[SHARDS:]}; queue {name}; {n:,} daily specs")
        t0 = time.perf_counter()
        with SyncShardedQueue(name, SHARDS, redis_url=url) as q:
            for i in range(0, n, CALL):
                q.upsert_repeatable_bulk(spec_items(i, min(n, i + CALL)))
        log(f"upserted {n:,} in {time.perf_counter() - t0:.1f}s; {ticking:,} specs fire every {EVERY_MS} ms")
        figures = run(url, name, nodes, shard_ports, ticking, args.after)
    result = {
        "benchmark": "cluster-failover",
        "mode": "smoke" if args.smoke else "full",
        "masters": SHARDS,
        "replicas_per_master": 1,
        "cluster_node_timeout_ms": NODE_TIMEOUT_MS,
        "machine": machine(),
        "daily_specs": n,
        **figures,
    }
    write_json(out_path, result)
    print(
        f"master of shard 0 killed: replica promoted in {figures['promotion_s']} s; shard 0 fired again "
        f"{figures['shard0_back_after_kill_s']} s after the kill (gap {figures['shard0_fire_gap_s']} s, "
        f"{figures['shard0_windows_in_gap']:,} windows in it: {figures['shard0_windows_fired_late']:,} fired late, "
        f"{figures['shard0_windows_skipped']:,} skipped); "
        f"fires seen twice: {figures['fires_seen_twice']} of {figures['fires_total']:,}"
    )
    for o in figures["other_shards"]:
        print(
            f"  shard {o['shard']}: lag p99 {o['lag_p99_before_ms']} ms before, {o['lag_p99_during_ms']} ms during; "
            f"longest pause {o['longest_pause_ms']} ms"
        )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
