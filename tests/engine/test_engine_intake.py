"""The consumer intake both consumers share (``engine/intake.py``): reading, claiming, the gate,
dead-lettering, leases and settling, on a real server (single node and the cluster, through
hash-tagged keys).  The contract both of its users pass is ``tests/airflow/test_intake_contract.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from engine_support import consumer_core, pending_count
from fault_support import FaultProxy
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from airflow_provider_chasqui.core.calls import str_reply
from airflow_provider_chasqui.core.consumer import ConsumerCore
from airflow_provider_chasqui.engine._clients import raw_client
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.intake import Intake


def _core(queue: str, consumer: str, max_attempts: int = 5) -> ConsumerCore:
    return consumer_core(queue, consumer_id=consumer, max_attempts=max_attempts)


@pytest.fixture
async def driver(redis_url: str) -> AsyncIterator[AsyncDriver]:
    d = AsyncDriver(redis_url)
    yield d
    await d.close()


@pytest.mark.timeout(60)
async def test_claim_renew_settle_and_reap(redis_url, queue_name, queues, clients, driver) -> None:
    q = queues(queue_name, redis_url)
    ids = [(await q.add("job", {"i": i})) for i in range(7)]
    a = Intake(driver, _core(queue_name, "a"), lease_ms=60_000)
    b = Intake(driver, _core(queue_name, "b"), lease_ms=60_000)
    await a.open()
    await a.ensure_group()  # exists already: not an error
    got = await a.next_batch(5, 10)
    assert [dl.delivery_count for dl in got] == [1] * 5 and a.in_flight == {dl.entry_id for dl in got}
    assert len(await a.next_batch(5, 10)) == 2  # the two left
    assert await a.next_batch(5, 10) == []  # nothing new: back after the block

    # b may claim only what was idle long enough, and never what it says it holds
    assert await b.claim_idle(60_000, 10) == []
    taken = await b.claim_idle(0, 2, skip=set())
    assert [row[0] for row in taken] == [dl.entry_id for dl in got[:2]]  # the oldest pending entries
    # a's next renewal finds those two lost to b; a still owns the rest
    await a.renew()
    assert a.lost == {got[0].entry_id: b"b", got[1].entry_id: b"b"}
    assert a.owned([(dl.entry_id,) for dl in got], 0) == [(dl.entry_id,) for dl in got[2:]]
    assert not a.lost and got[0].entry_id not in a.in_flight  # released unwritten

    # b settles what it took: acked and deleted in one round trip; the rest stays pending
    b.features = await driver.features()
    b.in_flight.update(row[0] for row in taken)
    await b.settle(done=[(eid, "", "job", 1, 0, b"") for eid, _f, _c in taken])
    assert not b.in_flight
    r = clients(redis_url)
    assert await pending_count(r, queue_name) == len(ids) - 2
    assert await b.renew_ids([row[0] for row in taken]) == {eid: b"" for eid, _f, _c in taken}  # nobody owns them
    # a consumer with nothing pending can be reaped; one with entries cannot
    assert await a.reap(0, "a") == []
    assert [str_reply(name) for name in await b.reap(0, "b")] == ["b"]
    assert {c["name"] for c in await r.xinfo_consumers(q.keys.stream, "default")} == {b"a"}


@pytest.mark.timeout(60)
async def test_an_earlier_runs_pending_entries_come_first(redis_url, queue_name, queues, driver) -> None:
    """A consumer restarted under the same name re-reads what it left pending, each a new delivery,
    before anything new; what it holds or has held for redelivery is never delivered twice."""
    q = queues(queue_name, redis_url)
    first = Intake(driver, _core(queue_name, "same"), lease_ms=60_000)
    await first.open()
    old = [await q.add("job", {"i": i}) for i in range(3)]
    assert len(await first.next_batch(10, 10)) == 3  # then "crashes": nothing settled
    new = await q.add("job", {"i": 3})
    again = Intake(driver, _core(queue_name, "same"), lease_ms=60_000)
    await again.open()
    got = await again.next_batch(2, 10)  # a page of the backlog first
    assert [dl.envelope.id for dl in got] == [j.id for j in old[:2]] and {dl.delivery_count for dl in got} == {2}
    again.hold({got[0].entry_id: 2}, time.monotonic() + 60)  # held: not redelivered before it is due
    rest = await again.next_batch(10, 10)
    assert [dl.envelope.id for dl in rest] == [old[2].id, new.id]
    assert got[0].entry_id not in again.in_flight and got[0].entry_id in again.holding()
    again.hold({got[0].entry_id: 2}, time.monotonic())  # now due
    assert [dl.delivery_count for dl in await again.next_batch(10, 10)] == [3]


@pytest.mark.timeout(60)
async def test_refused_entries_go_to_the_dlq_through_fail_batch(redis_url, queue_name, clients, driver) -> None:
    """The gate's refusals (here exhausted attempts and a malformed entry) are dead-lettered by the
    intake itself, in one call, and are never handed out; a DLQ that cannot be written is raised
    by the *next* read, after the good jobs of this one were handed over."""
    r = clients(redis_url)
    it = Intake(driver, _core(queue_name, "a", max_attempts=1), lease_ms=60_000)
    await it.open()
    k = it.core.keys
    bad = await r.xadd(k.stream, {"x": "no payload"})
    got = await it.next_batch(10, 10)
    assert got == [] and it.dead_lettered == 1 and await r.xlen(k.dlq) == 1
    assert await r.xrange(k.stream) == [] and not it.in_flight, bad
    await r.set(k.dlq, "not a stream")  # dead-lettering now fails for good
    await r.xadd(k.stream, {"x": "again"})
    async with _queue(redis_url, queue_name) as q:
        good = await q.add("job", {})
    got = await it.next_batch(10, 10)
    assert [dl.envelope.id for dl in got] == [good.id]  # handed over although the DLQ write failed
    with pytest.raises(Exception, match="WRONGTYPE"):
        await it.next_batch(10, 10)


@pytest.mark.timeout(60)
async def test_a_deleted_stream_is_recreated_and_reading_goes_on(redis_url, queue_name, clients, driver) -> None:
    r = clients(redis_url)
    it = Intake(driver, _core(queue_name, "a"), lease_ms=60_000)
    await it.open()
    await r.delete(it.core.keys.stream)  # NOGROUP on the next read
    assert await it.next_batch(10, 10) == []
    async with _queue(redis_url, queue_name) as q:
        job = await q.add("job", {})
    assert [dl.envelope.id for dl in await it.next_batch(10, 1000)] == [job.id]


@pytest.mark.timeout(60)
async def test_leases_are_renewed_while_held(redis_url, queue_name, queues, driver) -> None:
    """An entry held three leases long is never idle long enough for another consumer to take it."""
    await queues(queue_name, redis_url).add("job", {})
    holder = Intake(driver, _core(queue_name, "holder"), lease_ms=500)
    rival = Intake(driver, _core(queue_name, "rival"), lease_ms=500)
    await holder.open()
    [dl] = await holder.next_batch(1, 10)
    leases = asyncio.create_task(holder.run_leases())
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert await rival.claim_idle(500, 10) == []
            await asyncio.sleep(0.05)
    finally:
        leases.cancel()
    assert not holder.lost and dl.entry_id in holder.in_flight


@pytest.mark.timeout(60)
async def test_a_dead_consumers_entries_come_back_a_hold_after_its_last_renewal(
    redis_url, queue_name, queues, driver
) -> None:
    """The recovery pass runs every half lease, but one that sees entries about to lapse comes
    back for them as they do.  The survivor starts its passes as the dead consumer reads, so
    passes every half lease alone would land at 1.0 lease (too early: the hold is 1.1) and then
    1.5: the entries must come back at the hold (2.2 s), within 0.4 s (2.23-2.30 s seen, 3.06 s before)."""
    lease_ms = 2000
    await queues(queue_name, redis_url).add_bulk([{"name": "job", "data": {"i": i}} for i in range(3)])
    dead = Intake(driver, _core(queue_name, "dead"), lease_ms=lease_ms)
    survivor = Intake(driver, _core(queue_name, "survivor"), lease_ms=lease_ms)
    await dead.open()
    taken = await dead.next_batch(3, 10)  # read, then never renewed: the last renewal is the read
    read_at = time.monotonic()
    assert len(taken) == 3
    back: list[object] = []
    while not back and time.monotonic() - read_at < 5:
        back = await survivor.next_batch(10, 50)
    after = time.monotonic() - read_at
    assert sorted(dl.entry_id for dl in back) == sorted(dl.entry_id for dl in taken)
    assert [dl.delivery_count for dl in back] == [2, 2, 2]
    assert survivor.hold_ms / 1000 <= after + 0.05 and after <= survivor.hold_ms / 1000 + 0.4, after


def _queue(url: str, name: str):  # type: ignore[no-untyped-def]
    from airflow_provider_chasqui.engine.queue import Queue

    return Queue(name, redis_url=url)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["driver", "reader"])
async def test_a_cancelled_read_always_ends_the_task(path, redis_url, queue_name, driver) -> None:
    """redis-py can swallow a cancel that lands as a blocking read returns (redis-py#2028; about
    1 in 100 here): a task looping on ``next_batch`` must end anyway, or a triggerer could never
    stop its watcher.  150 cancels at shifting moments of a 30 ms read, each must end within 2 s."""
    from airflow_provider_chasqui.engine._clients import raw_client

    reader = raw_client(redis_url, single_connection_client=True) if path == "reader" else None
    it = Intake(driver, _core(queue_name, "c"), lease_ms=60_000, reader=reader)
    await it.open()

    async def consume() -> None:
        while True:
            await it.next_batch(10, 30)

    stuck = 0
    try:
        for i in range(150):
            task = asyncio.create_task(consume())
            await asyncio.sleep(0.03 + (i % 30) * 0.001)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            if not done:
                stuck += 1
                task.cancel()
                await asyncio.wait({task}, timeout=2)
    finally:
        await it.close()
    assert stuck == 0


@pytest.mark.single_node("a proxy in front of one server")
@pytest.mark.timeout(60)
async def test_a_batch_whose_admission_fails_is_handed_out_once(redis_url, queue_name, queues) -> None:
    """The flow gate holds a fresh batch before its controls are read; when that read fails
    (Redis went away between the read and the admission) the batch goes out once, from the
    gate, after Redis is back: never at once as well.  Handing it out both ways ran each job of
    such a batch twice (``tests/faults/test_restart.py`` saw it after a crash of Redis).  The
    checks the failure cut short (the jobs' own timeouts, cancels) are made before it goes."""
    q = queues(queue_name, redis_url)
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    async with FaultProxy(int(host_port.rsplit(":", 1)[1])) as proxy:
        # the driver (controls, timeouts, settling) goes through the proxy; the reader goes direct
        driver = AsyncDriver(redis_url.replace(host_port, f"127.0.0.1:{proxy.port}"), retry=Retry(NoBackoff(), 0))
        reader = raw_client(redis_url, single_connection_client=True)
        intake = Intake(driver, _core(queue_name, "a"), lease_ms=60_000, reader=reader)
        try:
            await intake.open()
            first = await q.add("job", {"i": -1}, timeout_ms=60_000)  # its queue now reads timeouts
            assert [dl.envelope.id for dl in await intake.next_batch(10, 10)] == [first.id]
            ids = [(await q.add("job", {"i": i}, timeout_ms=60_000)).id for i in range(5)]
            proxy.refuse()
            proxy.cut()  # the driver's connections go; the reader's stay
            handed = [dl.envelope.id for dl in await intake.next_batch(10, 10)]  # read, then admission fails
            assert handed == [], "the batch went out although its admission failed"
            assert len(intake.flow.held) == 5  # the gate has it
            proxy.refuse(False)
            deadline = time.monotonic() + 20
            later = []
            while len(later) < 5 and time.monotonic() < deadline:
                later += await intake.next_batch(10, 10)
            assert [dl.envelope.id for dl in later] == ids  # each once, in order
            assert [dl.timeout_ms for dl in later] == [60_000] * 5  # their own timeouts, read before they go
            assert await intake.next_batch(10, 10) == []
        finally:
            await intake.close()
            await driver.close()


@pytest.mark.single_node("a proxy in front of one server")
@pytest.mark.timeout(60)
async def test_an_entry_this_consumer_is_settling_is_not_reported_lost(redis_url, queue_name, queues, clients) -> None:
    """A renewal that runs after this consumer's own ack was applied, but before the ack's
    reply came back (here: the reply is lost and the write is being retried), finds the entry
    no longer pending.  That is the consumer's own settling, not a lease another worker took:
    no ``on_lost``, no "lease lost" warning (a pooled job cancelled mid-renewal logged one)."""
    q = queues(queue_name, redis_url)
    r = clients(redis_url)
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    async with FaultProxy(int(host_port.rsplit(":", 1)[1])) as proxy:
        driver = AsyncDriver(redis_url.replace(host_port, f"127.0.0.1:{proxy.port}"), retry=Retry(NoBackoff(), 0))
        heard: list[dict[bytes, bytes]] = []
        intake = Intake(driver, _core(queue_name, "a"), lease_ms=60_000, on_lost=heard.append)
        try:
            await intake.open()
            hits = 0
            for _ in range(5):  # the window is the write's first backoff (0.1 s): nearly always hit at once
                await q.add("job", {})
                [dl] = await intake.next_batch(10, 10)
                proxy.drop_replies = 1  # the ack runs; its reply is lost, so the write is retried
                settle = asyncio.ensure_future(intake.settle(done=[(dl.entry_id, dl.envelope.id, "job", 1, 0, b"")]))
                deadline = time.monotonic() + 10
                while await pending_count(r, queue_name) and time.monotonic() < deadline:
                    await asyncio.sleep(0.002)
                if not settle.done() and proxy.drop_replies == 0:  # the ack's reply was the one lost
                    hits += 1
                    await intake.renew()  # Redis: not pending any more
                    assert not intake.lost and heard == []
                await settle
                proxy.drop_replies = 0  # a drop the ack's reply did not meet is not left for the next read
                assert not intake.in_flight and not intake.settling
            assert hits >= 1, "the renewal never ran inside the settling write's window"
        finally:
            await intake.close()
            await driver.close()


@pytest.mark.timeout(60)
async def test_a_held_job_whose_lease_is_lost_is_never_handed_out(redis_url, queue_name, queues, driver) -> None:
    """A job the gate holds (a paused queue) is in flight and renewed; if another consumer takes
    it over (this one stalled past its lease), the renewal that learns it releases the job from
    the gate: once the queue resumes it is not handed out here, so it never runs twice."""
    q = queues(queue_name, redis_url)
    await q.pause()
    await q.add("job", {})
    a = Intake(driver, _core(queue_name, "a"), lease_ms=60_000)
    b = Intake(driver, _core(queue_name, "b"), lease_ms=60_000)
    await a.open()
    assert await a.next_batch(10, 10) == []  # read and held: the queue is paused
    [held] = a.flow.held
    taken = await b.claim_idle(0, 10, skip=set())  # as if a had stalled past its lease
    assert [row[0] for row in taken] == [held.entry_id]
    await a.renew()
    assert a.flow.held == [] and held.entry_id not in a.in_flight and not a.lost
    await q.resume()
    handed = []
    deadline = time.monotonic() + 3  # past the gate's pause poll and its controls cache
    while time.monotonic() < deadline:
        handed += await a.next_batch(10, 10)
    assert handed == []
