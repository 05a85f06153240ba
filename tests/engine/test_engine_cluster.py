"""What only a Redis Cluster can get wrong: the test cluster itself, the worker's blocking read
(unblocked on the node that holds the queue, whichever it is), stream reads routed without
asking a node for their keys, and a worker outliving the restart of its queue's node.  The rest
of the engine suite runs on the cluster too (tests/engine/conftest.py)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
from engine_support import running, wait_until
from servers import CLUSTER_KIND, Cluster, start_cluster

from airflow_provider_chasqui import Job, Queue, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(120)

SLOTS = 16384


def _queue_on_node(cluster: Cluster, index: int) -> str:
    """A fresh queue name whose hash slot lives on ``cluster.nodes[index]``."""
    port = cluster.nodes[index].port
    with cluster.client() as rc:
        for _ in range(1000):
            name = f"t-{uuid.uuid4().hex[:8]}"
            if rc.get_node_from_key(QueueKeys.for_queue(name).stream).port == port:
                return name
    raise AssertionError(f"no queue name hashed to node {index}")


def _drop_queue(cluster: Cluster, name: str) -> None:
    """Delete the queue's keys (one hash tag, so one node holds them all)."""
    prefix = QueueKeys.for_queue(name).prefix
    with cluster.client() as rc:
        node = rc.get_redis_connection(rc.get_node_from_key(prefix))
        keys = list(node.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*"))
        if keys:
            node.unlink(*keys)


def _blocked_readers(cluster: Cluster, index: int) -> int:
    """Clients blocked in XREADGROUP on ``cluster.nodes[index]``."""
    with cluster.nodes[index].client(socket_timeout=5) as r:
        return sum(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in r.client_list())


def _getkeys_calls(cluster: Cluster) -> int:
    total = 0
    for node in cluster.nodes:
        with node.client(socket_timeout=5) as r:
            total += int(r.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def test_the_test_cluster_is_three_masters_covering_every_slot(cluster_server: Cluster) -> None:
    c = cluster_server
    assert c.kind == CLUSTER_KIND and c.running and len(c.nodes) == 3
    assert c.url == f"redis://127.0.0.1:{c.nodes[0].port}/0?cluster=true"
    assert re.fullmatch(r"7\.0\.\d+", c.version)
    owners: dict[int, int] = {}
    for node in c.nodes:
        with node.client() as r:
            info = r.info("server")
            assert info["process_id"] == node.pid and info["redis_mode"] == "cluster"
            assert "cluster_state:ok" in r.execute_command("CLUSTER", "INFO").decode()
            (mine,) = [line for line in r.execute_command("CLUSTER", "NODES").decode().splitlines() if "myself" in line]
            assert "master" in mine.split()[2]
            for rng in mine.split()[8:]:
                lo, _, hi = rng.partition("-")
                for slot in range(int(lo), int(hi or lo) + 1):
                    owners[slot] = node.port
    assert len(owners) == SLOTS and len(set(owners.values())) == 3


@pytest.mark.parametrize("node", [0, 1, 2])
async def test_close_unblocks_the_read_on_the_node_of_the_queue(
    cluster_server: Cluster, node: int, worker_factory
) -> None:
    """CLIENT ID / CLIENT UNBLOCK name the reader's connection on the queue's node, not the
    cluster client's default node (else close() waits out the 60 s block)."""
    name = _queue_on_node(cluster_server, node)
    seen: list[int] = []
    # no recovery tick shortens the 60 s block either (claim_min_idle_ms / 2)
    w = worker_factory(
        name, lambda job: seen.append(job.data), cluster_server.url, read_block_ms=60_000, claim_min_idle_ms=240_000
    )
    q = Queue(name, redis_url=cluster_server.url)
    try:
        task = asyncio.create_task(w.run())
        await q.add("x", 1)  # the reader is past its first read, so the next one blocks
        await wait_until(lambda: seen == [1], what="the job")
        await wait_until(lambda: _blocked_readers(cluster_server, node), what="the reader blocked on the node")
        start = time.monotonic()
        await w.close()
        await asyncio.wait_for(task, 30)
        assert time.monotonic() - start < 10
    finally:
        await w.close()
        await q.close()
        _drop_queue(cluster_server, name)


async def test_stream_reads_need_no_command_getkeys(cluster_server: Cluster, queue_name: str, worker_factory) -> None:
    """redis-py would ask a node (COMMAND GETKEYS) where every XREADGROUP/XREAD goes: one more
    round trip per read; the driver finds the slot from the STREAMS keys itself."""
    url = cluster_server.url
    q = Queue(queue_name, redis_url=url)
    done: list[Job] = []
    try:
        before = _getkeys_calls(cluster_server)
        async with running(worker_factory(queue_name, done.append, url, read_block_ms=20, store_results=True)):
            jobs = await q.add_bulk([{"name": "r", "data": i} for i in range(20)])
            outcomes = await q.wait_for_results([j.id for j in jobs], timeout=30)
        assert len(outcomes) == 20 and len(done) == 20
        # an id that never ends: each wait blocks in XREAD on the events stream until its deadline
        assert await q.wait_for_results(["never-added"], timeout=0.3) == {}
        with SyncQueue(queue_name, redis_url=url) as sq:  # the blocking driver's cluster client too
            assert await asyncio.to_thread(sq.wait_for_results, ["never-added"], 0.3) == {}
            assert await asyncio.to_thread(sq.wait_for_results, [j.id for j in jobs], 30) == outcomes
        assert _getkeys_calls(cluster_server) == before
    finally:
        await q.close()


async def test_worker_survives_a_restart_of_its_queues_node(tmp_path, worker_factory) -> None:
    """The node holding the queue crashes (SIGKILL) and comes back on its port with its AOF and
    nodes.conf: the worker retries through it and loses nothing, the held job included.
    A private cluster: the session's one is shared by other tests."""
    cluster = start_cluster(tmpdir=tmp_path, extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    name = _queue_on_node(cluster, 1)  # not the seed node the clients start from
    node = cluster.nodes[1]
    k = QueueKeys.for_queue(name)
    seen: list[object] = []
    release = asyncio.Event()

    async def handler(job: Job) -> int:
        if job.data == "hold":
            await release.wait()  # in flight while its node is down
        seen.append(job.data)
        return 1

    q = Queue(name, redis_url=cluster.url)
    r = cluster.client()
    try:
        w = worker_factory(name, handler, cluster.url, promoter_poll_ms=20, claim_min_idle_ms=1000)
        async with running(w) as task:
            await q.add("r", 1)
            await wait_until(lambda: seen == [1], what="first job")
            await q.add("r", "hold")
            await wait_until(lambda: w._intake.in_flight, what="the held job running")
            await asyncio.to_thread(node.kill)
            await asyncio.to_thread(node.start)
            await asyncio.to_thread(cluster.wait_ok)
            assert not task.done()
            release.set()
            await wait_until(lambda: _adds_work(q), timeout=60, what="adds accepted again")
            await q.add("r", 3, delay=100)  # through the promoter too
            await wait_until(
                lambda: sorted(map(str, seen)) == ["1", "2", "3", "hold"],
                timeout=60,
                what="every job after the restart",
            )
            await wait_until(lambda: r.xlen(k.stream) == 0, timeout=30, what="all acked")
            assert not task.done()
        assert r.xpending(k.stream, "default")["pending"] == 0
        for n in cluster.nodes:
            with n.client() as nc:
                assert "errorstat_CROSSSLOT" not in nc.info("errorstats")
    finally:
        await q.close()
        r.close()
        cluster.stop()


async def _adds_work(q: Queue) -> bool:
    """Job 2, once the producer's cluster client has found the node again."""
    try:
        await q.add("r", 2, job_id="after-restart")
    except Exception:  # noqa: BLE001 - the node may refuse (loading) or the slot map be stale
        return False
    return True
