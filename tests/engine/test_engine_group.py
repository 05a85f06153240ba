"""The consumer engine both consumers share (``engine/group.py``): reading, claiming, leases
and settling, on a real server (single node and the cluster, through hash-tagged keys)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from engine_support import pending_count

from airflow_provider_chasqui.core.calls import str_reply
from airflow_provider_chasqui.core.codec import now_ms
from airflow_provider_chasqui.core.consumer import ConsumerCore
from airflow_provider_chasqui.core.retry import RetryPolicy
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.group import GroupConsumer


def _core(queue: str, consumer: str) -> ConsumerCore:
    return ConsumerCore(
        queue,
        group="default",
        consumer_id=consumer,
        max_attempts=5,
        settings=QueueSettings(),
        retry=RetryPolicy(),
        events=True,
        result_ttl_ms=0,
        failure_ttl_ms=0,
    )


@pytest.fixture
async def driver(redis_url: str) -> AsyncIterator[AsyncDriver]:
    d = AsyncDriver(redis_url)
    yield d
    await d.close()


@pytest.mark.timeout(60)
async def test_read_claim_renew_and_settle(redis_url, queue_name, queues, clients, driver) -> None:
    q = queues(queue_name, redis_url)
    ids = [(await q.add("job", {"i": i})) for i in range(7)]
    a = GroupConsumer(driver, _core(queue_name, "a"))
    b = GroupConsumer(driver, _core(queue_name, "b"))
    await a.ensure_group()
    await a.ensure_group()  # exists already: not an error
    rows = await a.read_new(5, None)
    assert [r[2] for r in rows] == [1] * 5 and len({r[0] for r in rows}) == 5
    assert await a.read_new(5, None) != []  # the two left
    assert await a.read_new(5, None) == []  # nothing new, and no wait (block None)

    # a's own pending list, paged by the cursor; what a holds is skipped, never redelivered
    held = {rows[0][0]}
    first, cursor = await a.claim_own("-", 4, held)
    assert cursor is not None and len(first) == 3 and all(r[2] == 2 for r in first)
    rest, cursor = await a.claim_own(cursor, 4, held)
    assert cursor is None and len(rest) == 3

    # b may claim only what was idle long enough, and never what it says it holds
    assert await b.claim_idle(60_000, 10) == []
    taken = await b.claim_idle(0, 2, skip=set())
    assert len(taken) == 2
    # a's lease on those is lost to b; the others a still owns
    assert [r[0] for r in taken] == [r[0] for r in rows[:2]]  # the oldest pending entries
    assert await a.renew([r[0] for r in rows]) == {rows[0][0]: b"b", rows[1][0]: b"b"}

    # settle what b holds: acked and deleted in one round trip; the rest stays pending
    features = await driver.features()
    done = [(eid, "", "job", 1, 0, b"") for eid, _f, _c in taken]
    await b.settle(done, [], features, now_ms())
    r = clients(redis_url)
    assert await pending_count(r, queue_name) == len(ids) - 2
    assert await b.renew([r_[0] for r_ in taken]) == {eid: b"" for eid, _f, _c in taken}  # settled: nobody owns them
    # a consumer with nothing pending can be reaped; one with entries cannot
    assert await a.reap(0, "a") == []
    assert [str_reply(name) for name in await b.reap(0, "b")] == ["b"]
    assert {c["name"] for c in await r.xinfo_consumers(q.keys.stream, "default")} == {b"a"}
