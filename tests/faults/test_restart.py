"""Redis restarts under load: the worker and the producer reconnect on their own.

A dedicated redis7 with AOF is restarted on the same port while a worker drains 20,000
jobs, its embedded scheduler fires a spec every 100 ms, and a producer keeps adding more
(retrying an add that failed, as a caller would):

* graceful restart (SIGTERM) with ``appendfsync everysec``: Redis fsyncs the AOF on shutdown;
* crash (SIGKILL) with ``appendfsync always``: every reply follows an fsync; Redis stays down
  for three leases before it restarts.

In both, no job id runs twice (an acked job never reappears: ack, XDEL and the ``completed``
event are one script, replayed from the AOF as one unit), every job whose add was confirmed
runs (no unacked job is lost), the scheduler fires again after the restart with no fire run
twice, and the stream and its PEL end empty.  An add that failed
with a connection error is *uncertain* (it may have been applied); it is retried with the
same data and may legitimately run twice under two job ids.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
from engine_support import raw_async, running, wait_until
from fault_support import chunks
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from servers import start_server

from airflow_provider_chasqui import Queue, RepeatPattern, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import ChasquiConnectionError

N0 = 20_000


async def _restart_under_load(tmp_path, *, fsync: str, crash: bool, down_s: float = 0.0) -> dict[str, object]:
    server = start_server("redis7", tmpdir=tmp_path, extra_args=("--appendonly", "yes", "--appendfsync", fsync))
    queue = f"restart-{fsync}"
    keys = QueueKeys.for_queue(queue)
    runs: collections.Counter[str] = collections.Counter()
    ran_i: set[int] = set()
    runs_of_i: collections.Counter[int] = collections.Counter()

    fires: list[str] = []
    # each run's (seconds since the kill, attempt): a failure says when a duplicate ran
    seen: collections.defaultdict[str, list[tuple[float, int]]] = collections.defaultdict(list)
    t_down = float("inf")

    async def handler(job) -> None:
        await asyncio.sleep(0.002)
        runs[job.id] += 1
        seen[job.id].append((round(time.monotonic() - t_down, 3), job.attempt))
        if job.name == "tick":  # a fire of the repeatable spec: its id names the fire
            fires.append(job.id)
            return
        runs_of_i[job.data["i"]] += 1
        ran_i.add(job.data["i"])

    confirmed: set[int] = set(range(N0))
    uncertain: set[int] = set()
    restarted = asyncio.Event()
    stop_producing = asyncio.Event()
    after_restart = 0

    async def produce(q: Queue) -> None:
        nonlocal after_restart
        i = N0
        while not stop_producing.is_set():
            try:
                await q.add("load", {"i": i})
            except ChasquiConnectionError:
                uncertain.add(i)  # maybe applied: retry the same data (a second job id if it was)
                await asyncio.sleep(0.02)  # a caller's backoff, not synchronisation
                continue
            confirmed.add(i)
            i += 1
            if restarted.is_set():
                after_restart += 1
                if after_restart >= 1000:
                    stop_producing.set()

    try:
        # No redis-py retry for the producer (explicitly, whatever redis-py's default): every
        # failed add surfaces, so "uncertain" is exact.
        async with Queue(queue, driver=AsyncDriver(server.url, retry=Retry(NoBackoff(), 0))) as q:
            for part in chunks(list(range(N0)), 5000):
                await q.add_bulk([{"name": "load", "data": {"i": i}} for i in part])
            await q.upsert_repeatable_job("tick", {}, repeat=RepeatPattern.every(100), key="tick")
            worker = Worker(
                queue,
                handler,
                redis_url=server.url,
                concurrency=20,
                claim_min_idle_ms=1000,
                read_block_ms=500,
                run_scheduler=True,
                scheduler_tick_ms=50,
            )
            async with running(worker) as task:
                producer = asyncio.create_task(produce(q))
                await wait_until(lambda: len(ran_i) >= N0 // 4, 60, what="a quarter of the jobs to run")
                before = len(ran_i)
                t_down = time.monotonic()
                await asyncio.to_thread(server.kill if crash else server.stop)
                await asyncio.sleep(down_s)  # the outage's length (a fault, not a wait for a condition)
                await asyncio.to_thread(server.start)
                downtime = time.monotonic() - t_down
                restarted.set()
                async with raw_async(server.url) as r:  # fires counted where they happen: the spec's hash
                    r.response_callbacks.clear()

                    async def fired() -> int:
                        return int(await r.execute_command("HGET", keys.repeat_spec("tick"), "fired") or 0)

                    fired_at_restart = await fired()
                    await wait_until(
                        lambda: _at_least(fired, fired_at_restart + 5),
                        30,
                        what="the embedded scheduler to fire again after the restart",
                    )
                while True:  # stop the schedule so the final counts are stable
                    try:
                        assert await q.remove_repeatable_by_key("tick")
                        break
                    except ChasquiConnectionError:  # still possible just after the restart
                        await asyncio.sleep(0.05)
                await wait_until(stop_producing.is_set, 60, what="1,000 confirmed adds after the restart")
                await producer
                async with raw_async(server.url) as r:
                    r.response_callbacks.clear()

                    async def drained() -> bool:
                        pel = await r.execute_command("XPENDING", keys.stream, "default")
                        return (
                            confirmed <= ran_i
                            and int(await r.execute_command("XLEN", keys.stream)) == 0
                            and int(pel[0]) == 0
                        )

                    await wait_until(
                        drained, 120, what="every confirmed job to run and the stream to drain", interval=0.05
                    )
                    assert not task.done(), "the worker stopped"
                    completed = collections.Counter()
                    for _eid, flat in await r.execute_command("XRANGE", keys.events, "-", "+"):
                        f = dict(zip(flat[::2], flat[1::2]))
                        if f[b"e"] == b"completed":
                            completed[f[b"id"].decode()] += 1
                    dlq = int(await r.execute_command("XLEN", keys.dlq))
    finally:
        server.stop()

    twice = {j: c for j, c in runs.items() if c > 1}
    assert not twice, (
        f"{len(twice)} job ids ran more than once (an acked job reappeared); runs as (s after the kill, "
        f"attempt): {[(j, seen[j]) for j in list(twice)[:8]]}; downtime {downtime:.2f}s"
    )
    assert confirmed <= ran_i, f"lost: {sorted(confirmed - ran_i)[:10]}"
    assert len(set(fires)) == len(fires), "a schedule fire ran twice"
    assert set(completed) == set(runs), "a job ran without its completed event, or the reverse"
    assert max(completed.values()) == 1, "an ack was applied twice"
    assert dlq == 0
    assert {i for i, c in runs_of_i.items() if c > 1} <= uncertain, "only an uncertain add may run twice"
    return {
        "jobs_run": len(runs) - len(fires),
        "schedule_fires_run": len(fires),
        "fired_before_restart": fired_at_restart,
        "confirmed_adds": len(confirmed),
        "uncertain_adds": len(uncertain),
        "ran_before_restart": before,
        "downtime_s": round(downtime, 2),
        "uncertain_added_twice": sum(1 for i in uncertain if runs_of_i[i] > 1),
    }


async def _at_least(read, want: int) -> bool:
    return await read() >= want


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_graceful_restart_with_aof_everysec(tmp_path) -> None:
    t0 = time.monotonic()
    figures = await _restart_under_load(tmp_path, fsync="everysec", crash=False)
    print(f"\n[restart everysec SIGTERM] {figures} elapsed={time.monotonic() - t0:.1f}s")


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_crash_restart_with_aof_always(tmp_path) -> None:
    t0 = time.monotonic()
    # down for 3 s, three leases: every entry in flight is idle past its lease when Redis is back,
    # and the worker's reads and writes have backed off to seconds (a batch read as Redis died
    # once ran twice here: see test_engine_intake.py::test_a_batch_whose_admission_fails_is_handed_out_once)
    figures = await _restart_under_load(tmp_path, fsync="always", crash=True, down_s=3.0)
    print(f"\n[restart always SIGKILL] {figures} elapsed={time.monotonic() - t0:.1f}s")
