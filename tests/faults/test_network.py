"""Network faults between workers and Redis, injected by a TCP proxy in the test.

Two workers and a producer reach Redis only through :class:`fault_support.FaultProxy`, which
stalls (holds every byte, connections open), cuts (RST on every connection), refuses new
connections, and cuts while stalled (requests and replies in the proxy are lost).  Faults
are triggered by progress (every ~1,500 jobs run), so they land mid-load on any machine.

Proven: the workers survive on their own, every job whose add was confirmed runs, the
stream and its PEL end empty and nothing is dead-lettered.  A job may run twice only when
a fault outlasted ``claim_min_idle_ms`` while it was in flight (reported).
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
from engine_support import raw_async, running, wait_until
from fault_support import FaultProxy, chunks
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from airflow_provider_chasqui import Queue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import ChasquiConnectionError

N0 = 15_000


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _drained(r, keys: QueueKeys) -> bool:
    pel = await r.execute_command("XPENDING", keys.stream, "default")
    return int(await r.execute_command("XLEN", keys.stream)) == 0 and int(pel[0]) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_stalls_cuts_and_refusals_lose_nothing(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    runs: collections.Counter[int] = collections.Counter()
    confirmed: set[int] = set(range(N0))
    uncertain: set[int] = set()

    async def handler(job) -> None:
        await asyncio.sleep(0.001)
        runs[job.data["i"]] += 1

    async with Queue(queue_name, redis_url=redis_url) as direct:
        for part in chunks(list(range(N0)), 5000):
            await direct.add_bulk([{"name": "net", "data": {"i": i}} for i in part])

    faults_done = asyncio.Event()
    log: list[str] = []

    async def inject(proxy: FaultProxy) -> None:
        """One fault per ~1,500 jobs run; durations are the faults themselves, not waits."""
        plan = [
            ("stall", 1.5),
            ("cut", 0),
            ("refuse", 0.7),
            ("stall-then-cut", 0.4),
            ("cut", 0),
            ("stall", 0.3),
            ("refuse+cut", 1.2),
            ("stall-then-cut", 1.2),
        ]
        for step, (kind, seconds) in enumerate(plan, 1):
            await wait_until(lambda step=step: len(runs) >= 1500 * step, 60, what=f"progress before fault {step}")
            if kind == "stall":
                proxy.pause()
                await asyncio.sleep(seconds)
                proxy.resume()
            elif kind == "cut":
                proxy.cut()
            elif kind == "refuse":
                proxy.refuse()
                await asyncio.sleep(seconds)
                proxy.refuse(False)
            elif kind == "refuse+cut":
                proxy.refuse()
                proxy.cut()
                await asyncio.sleep(seconds)
                proxy.refuse(False)
            elif kind == "stall-then-cut":
                proxy.pause()
                await asyncio.sleep(seconds)
                proxy.cut()  # bytes held in the proxy are lost both ways
                proxy.resume()
            log.append(kind)
        faults_done.set()

    async def produce(q: Queue) -> None:
        i = N0
        while not faults_done.is_set():
            try:
                await q.add("net", {"i": i})
            except ChasquiConnectionError:
                uncertain.add(i)
                await asyncio.sleep(0.01)  # a caller's backoff
                continue
            confirmed.add(i)
            i += 1

    t0 = time.monotonic()
    async with FaultProxy(_port(redis_url)) as proxy:
        workers = [
            Worker(
                queue_name,
                handler,
                redis_url=proxy.url,
                concurrency=20,
                claim_min_idle_ms=1000,
                read_block_ms=500,
                run_scheduler=False,
                consumer_id=f"net-{n}",
            )
            for n in (1, 2)
        ]
        async with running(workers[0]) as t1, running(workers[1]) as t2:
            async with Queue(queue_name, driver=AsyncDriver(proxy.url, retry=Retry(NoBackoff(), 0))) as q:
                await asyncio.gather(inject(proxy), produce(q))
            async with raw_async(redis_url) as r:
                r.response_callbacks.clear()
                await wait_until(lambda: confirmed <= set(runs), 120, what="every confirmed job to run")
                await wait_until(lambda: _drained(r, keys), 60, what="stream and PEL to drain", interval=0.05)
                dlq = int(await r.execute_command("XLEN", keys.dlq))
            assert not t1.done() and not t2.done(), "a worker stopped"
        cuts, accepted = proxy.cuts, proxy.accepted

    lost = confirmed - set(runs)
    assert not lost, f"lost {len(lost)} jobs, e.g. {sorted(lost)[:10]}"
    assert dlq == 0
    twice = {i: c for i, c in runs.items() if c > 1}
    from_uncertain = sum(1 for i in twice if i in uncertain)
    print(
        f"\n[network] faults={log} connections_cut={cuts} connections_opened={accepted} "
        f"confirmed_adds={len(confirmed)} uncertain_adds={len(uncertain)} jobs_run={sum(runs.values())} "
        f"ran_more_than_once={len(twice)} (of which uncertain adds: {from_uncertain}) lost=0 "
        f"elapsed={time.monotonic() - t0:.1f}s"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("url_timeout", [False, True], ids=["default-url", "socket_timeout-in-url"])
async def test_blackholed_connections_are_abandoned(redis_url: str, queue_name: str, url_timeout: bool) -> None:
    """Connections that go silent for ever (no FIN, no RST: a dead NAT entry, a VM paused on
    the other side) must not wedge the worker: it gives up on them and reconnects."""
    keys = QueueKeys.for_queue(queue_name)
    ran: set[int] = set()

    async def handler(job) -> None:
        ran.add(job.data["i"])

    async with FaultProxy(_port(redis_url)) as proxy:
        url = proxy.url + ("?socket_timeout=3" if url_timeout else "")
        worker = Worker(
            queue_name,
            handler,
            redis_url=url,
            concurrency=10,
            claim_min_idle_ms=1000,
            read_block_ms=500,
            run_scheduler=False,
        )
        async with Queue(queue_name, redis_url=redis_url) as direct, running(worker, stop_timeout=60) as task:
            await direct.add_bulk([{"name": "bh", "data": {"i": i}} for i in range(100)])
            await wait_until(lambda: len(ran) == 100, 30, what="first batch")
            silenced = proxy.blackhole()
            assert silenced >= 2
            t0 = time.monotonic()
            await direct.add_bulk([{"name": "bh", "data": {"i": i}} for i in range(100, 200)])
            await wait_until(lambda: len(ran) == 200, 60, what="the worker to abandon black-holed connections")
            recovered_in = time.monotonic() - t0
            async with raw_async(redis_url) as r:
                r.response_callbacks.clear()
                await wait_until(lambda: _drained(r, keys), 30, what="drain", interval=0.05)
            assert not task.done()
    # The default gives up after read_block_ms + 10 s; a URL's socket_timeout=3 wins over it.
    if url_timeout:
        assert recovered_in < 9, recovered_in
    print(f"\n[blackhole {'url socket_timeout=3' if url_timeout else 'default'}] recovered in {recovered_in:.1f}s")
