"""Sentinel: after a failover the worker follows the new master on its own.

One master, one replica and one Sentinel (quorum 1) on loopback ports, started by the test.
The worker and the producer connect with ``redis+sentinel://127.0.0.1:<port>/<service>``.
Half-way through 3,000 jobs ``SENTINEL FAILOVER`` promotes the replica; the producer then
adds 1,000 more.  Proven: every job runs at least once, the new master's stream and PEL end
empty, the worker never stops, and no job added after the failover runs twice.

Sentinel does not fence the old master: it stays writable until Sentinel demotes it (about
8 s later) and kills its clients, so acks the worker wrote there meanwhile are discarded when
it resyncs from the new master, and those jobs run again (at-least-once; reported).
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
import redis
from engine_support import raw_async, running, wait_until, wait_until_sync
from fault_support import chunks, start_sentinel
from servers import binary_for, start_server

from airflow_provider_chasqui import Queue, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.sentinel_url import parse_sentinel_url
from airflow_provider_chasqui.errors import ChasquiConnectionError, ConfigError

SERVICE = "chasqui-m"


# ---- URL parsing (no server) ---------------------------------------------------------------------
def test_sentinel_url_parsing() -> None:
    t = parse_sentinel_url(
        "redis+sentinel://u:p%40ss@10.0.0.1:26380,[::1],h3/svc/2?socket_timeout=3"
        "&sentinel_password=sp&sentinel_username=su"
    )
    assert t.sentinels == (("10.0.0.1", 26380), ("::1", 26379), ("h3", 26379))
    assert t.service == "svc"
    assert t.node_url == "redis://u:p%40ss@sentinel/2?socket_timeout=3"
    assert t.sentinel_kwargs == {"password": "sp", "username": "su"}
    tls = parse_sentinel_url("rediss+sentinel://h/svc?ssl_ca_certs=%2Ftmp%2Fca.pem")
    assert tls.node_url == "rediss://sentinel/0?ssl_ca_certs=%2Ftmp%2Fca.pem"
    for bad in (
        "redis+sentinel://h",
        "redis+sentinel://h/svc/x",
        "redis+sentinel:///svc",
        "redis://h/0",
        "redis+sentinel://h:99999/svc",
        "redis+sentinel://h/a/1/2",
    ):
        with pytest.raises(ConfigError):
            parse_sentinel_url(bad)


# ---- the failover ----------------------------------------------------------------------------------
def _role(port: int) -> str:
    with redis.Redis(port=port, socket_timeout=2) as r:
        return r.info("replication")["role"]


def _master_port(sentinel_port: int) -> int:
    with redis.Redis(port=sentinel_port, socket_timeout=2, decode_responses=True) as s:
        return int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])


@pytest.fixture
def sentinel_setup(tmp_path):
    master = start_server("redis7", tmpdir=tmp_path)
    replica = sentinel = None
    try:
        replica = start_server("redis7", tmpdir=tmp_path, extra_args=("--replicaof", "127.0.0.1", str(master.port)))
        with replica.client() as r:
            wait_until_sync(
                lambda: r.info("replication").get("master_link_status") == "up", 30, what="the replica to sync"
            )
        sentinel = start_sentinel(binary_for("redis7"), tmp_path, SERVICE, master.port)
        with redis.Redis(port=sentinel.port, socket_timeout=2, decode_responses=True, protocol=2) as s:

            def promotable() -> bool:  # what Sentinel's replica selection checks (else NOGOODSLAVE)
                for flat in s.execute_command("SENTINEL", "REPLICAS", SERVICE) or []:
                    f = dict(zip(flat[::2], flat[1::2]))
                    if f["flags"] == "slave" and f["master-link-status"] == "ok" and int(f["info-refresh"]) < 5000:
                        return True
                return False

            wait_until_sync(promotable, 60, what="sentinel to rate the replica promotable", interval=0.05)
        yield master, replica, sentinel
    finally:
        if sentinel is not None:
            sentinel.stop()
        if replica is not None:
            replica.stop()
        master.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_worker_follows_the_new_master_after_failover(sentinel_setup) -> None:
    master, replica, sentinel = sentinel_setup
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/{SERVICE}"
    queue = "sentinel-failover"
    keys = QueueKeys.for_queue(queue)
    runs: collections.Counter[int] = collections.Counter()

    async def handler(job) -> None:
        await asyncio.sleep(0.004)  # ~1,000 jobs/s with 5 slots: the failover lands mid-load
        runs[job.data["i"]] += 1

    t0 = time.monotonic()
    with SyncQueue(queue, redis_url=url) as sq:  # the blocking producer also goes through Sentinel
        for part in chunks(list(range(3000)), 1000):
            sq.add_bulk([{"name": "s", "data": {"i": i}} for i in part])
    with master.client() as m:  # the replica holds every add before the failover starts
        assert m.execute_command("WAIT", 1, 10_000) == 1

    worker = Worker(
        queue, handler, redis_url=url, concurrency=5, claim_min_idle_ms=1000, read_block_ms=500, run_scheduler=False
    )
    async with running(worker) as task:
        await wait_until(lambda: len(runs) >= 1000, 60, what="a third of the jobs before the failover")
        at_request = len(runs)
        with redis.Redis(port=sentinel.port, socket_timeout=5) as s:

            def failover() -> bool:
                try:
                    return bool(s.execute_command("SENTINEL", "FAILOVER", SERVICE))
                except redis.ResponseError as exc:  # the replica is not rated good yet
                    if "NOGOODSLAVE" in str(exc):
                        return False
                    raise

            await wait_until(failover, 30, what="SENTINEL FAILOVER to be accepted", interval=0.1)
        await wait_until(
            lambda: _master_port(sentinel.port) == replica.port and _role(replica.port) == "master",
            60,
            what="sentinel to promote the replica",
            interval=0.05,
        )
        t_failover = time.monotonic()
        at_failover = len(runs)
        confirmed = set(range(3000))
        async with Queue(queue, redis_url=url) as q:  # added on the new master, through Sentinel
            i = 3000
            while i < 4000:
                try:
                    await q.add("s", {"i": i})
                except ChasquiConnectionError:  # the demoted master answered (READONLY) or closed
                    await asyncio.sleep(0.05)  # a caller's backoff
                    continue
                confirmed.add(i)
                i += 1
        async with raw_async(replica.url) as r:
            r.response_callbacks.clear()

            async def drained() -> bool:
                pel = await r.execute_command("XPENDING", keys.stream, "default")
                return (
                    confirmed <= set(runs)
                    and int(await r.execute_command("XLEN", keys.stream)) == 0
                    and int(pel[0]) == 0
                )

            await wait_until(drained, 120, what="every job to run on the new master", interval=0.05)
            clients = (await r.execute_command("CLIENT", "LIST")).decode()
        assert not task.done(), "the worker stopped"
        followed_in = time.monotonic() - t_failover
    assert "cmd=xreadgroup" in clients, "the worker's reader is not on the new master"
    await wait_until(lambda: _role(master.port) == "slave", 60, what="the old master to be demoted")
    twice = {i: c for i, c in runs.items() if c > 1}
    assert confirmed <= set(runs)
    assert all(i < 3000 for i in twice), "a job added after the failover ran twice"
    print(
        f"\n[sentinel] jobs={len(confirmed)} ran_at_failover_request={at_request} "
        f"ran_when_promotion_seen={at_failover} duplicates={len(twice)} (all added before the failover) "
        f"new_master_port={replica.port} old_master_role=slave drained_after={followed_in:.1f}s "
        f"elapsed={time.monotonic() - t0:.1f}s"
    )
