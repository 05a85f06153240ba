"""Scale-out on a three-master Redis Cluster started on loopback: one logical schedule set over
shard queues placed by their hash slots, served by a ShardedWorker; every script single-slot."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from servers import Cluster

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern
from airflow_provider_chasqui.core.codec import ulid_ms
from airflow_provider_chasqui.core.sharding import shard_of
from airflow_provider_chasqui.engine.sharded import ShardedQueue, ShardedWorker
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue

SHARDS = 6
SPECS = 300


@pytest.fixture
def cluster(cluster_server: Cluster) -> Cluster:
    """The session's test cluster (tests/conftest.py), shared with the engine suite."""
    return cluster_server


def node_of_shard(rc: RedisCluster, name: str, i: int) -> str:
    node = rc.get_node_from_key(f"{{chasqui:{name}.{i}}}:repeat")
    return f"{node.host}:{node.port}"


async def test_sharded_schedules_on_a_cluster(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    name = "cl-sched"
    seen: dict[str, list[int]] = collections.defaultdict(list)

    async def handler(job: Any) -> None:
        seen[job.data["k"]].append(ulid_ms(job.id))

    async with ShardedQueue(name, SHARDS, redis_url=cluster.url) as sq:
        keys = await sq.upsert_repeatable_bulk(
            [
                {
                    "name": "tick",
                    "data": {"k": f"s{i}"},
                    "key": f"s{i}",
                    "repeat": RepeatPattern.every(500),
                    "missed_fires": MissedFiresPolicy.fire_all(100),
                }  # late ticks on a busy machine replay, not skip
                for i in range(SPECS)
            ]
        )
        assert keys == [f"s{i}" for i in range(SPECS)]
        per_shard = collections.Counter(shard_of(k, SHARDS) for k in keys)
        assert len(per_shard) == SHARDS and min(per_shard.values()) > SPECS // SHARDS // 3

        rc = RedisCluster.from_url(cluster.url.replace("?cluster=true", ""))
        try:
            nodes = {node_of_shard(rc, name, i) for i in range(SHARDS)}
            assert len(nodes) >= 2  # the shards really live on different masters
            for i in range(SHARDS):
                assert rc.zcard(f"{{chasqui:{name}.{i}}}:repeat") == per_shard[i]
        finally:
            rc.close()

        # the whole API routes by key
        info = await sq.get_repeatable_job("s7")
        assert info is not None and info.data == {"k": "s7"}
        assert await sq.pause_repeatable("s7") and (await sq.get_repeatable_job("s7")).paused
        assert await sq.resume_repeatable("s7")
        listed, cursor = [], None
        while True:
            page, cursor = await sq.list_repeatable(cursor, count=40)
            listed += page
            if cursor is None:
                break
        assert sorted(i.key for i in listed) == sorted(f"s{i}" for i in range(SPECS))
        assert len(await sq.get_repeatable_jobs(50)) == 50

        worker = ShardedWorker(
            name, handler, shards=SHARDS, redis_url=cluster.url, concurrency=20, read_block_ms=200, events_enabled=False
        )
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(3.0)
        finally:
            await worker.close()
            await asyncio.wait_for(task, 60)
        assert await sq.remove_repeatable_by_key("s1")
        assert await sq.get_repeatable_job("s1") is None
        assert await sq.get_quarantined() == {}

    assert len(seen) == SPECS  # every spec, on every shard, fired and was processed
    for key, times in seen.items():
        times.sort()
        assert len(times) == len(set(times)), key
        assert all(b - a == 500 for a, b in zip(times, times[1:])), (key, times)
    assert "CROSSSLOT" not in caplog.text and "non local key" not in caplog.text


def test_sync_sharded_queue_on_a_cluster(cluster: Cluster) -> None:
    with SyncShardedQueue("cl-sync", 3, redis_url=cluster.url) as sq:
        keys = sq.upsert_repeatable_bulk(
            [{"name": "n", "data": i, "repeat": RepeatPattern.every(60_000 + i)} for i in range(30)]
        )
        assert len(set(keys)) == 30
        fired = sq.trigger_repeatable(keys[0])
        assert fired is not None and fired.data == 0
        one = sq.upsert_repeatable_job("single", 1, repeat=RepeatPattern.cron("0 * * * *", tz="Europe/Madrid"))
        assert sq.get_repeatable_job(one.id).pattern.tz == "Europe/Madrid"
        assert sq.pause_repeatable(one.id) and sq.resume_repeatable(one.id)
        assert sq.remove_repeatable_by_key(one.id)
        total = 0
        cursor = None
        while True:
            items, cursor = sq.list_repeatable(cursor, count=7)
            total += len(items)
            if cursor is None:
                break
        assert total == 30
        with redis.Redis(port=cluster.nodes[0].port) as r:
            assert r.ping()
