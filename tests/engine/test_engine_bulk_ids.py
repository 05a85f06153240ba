"""add_bulk with caller ids: one pipeline, dedup per id, delayed ones cancellable."""

from __future__ import annotations

from tests.engine_support import raw_async


async def test_bulk_with_ids_dedups_and_keeps_order(redis_url: str, queue_name: str, queues) -> None:
    q = queues(queue_name, redis_url)
    first = await q.add("send", {"n": 0}, job_id="dup")
    jobs = await q.add_bulk(
        [
            {"name": "send", "data": {"n": 1}},
            {"name": "send", "data": {"n": 2}, "job_id": "dup"},  # suppressed: the first add holds the id
            {"name": "send", "data": {"n": 3}, "job_id": "fresh"},
            {"name": "later", "data": {"n": 4}, "job_id": "later-1", "delay_ms": 60_000},
        ]
    )
    assert [j.id for j in jobs][1:] == ["dup", "fresh", "later-1"] and first.id == "dup"
    assert [j.data for j in jobs] == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    r = raw_async(redis_url)
    assert await r.xlen(q.keys.stream) == 3  # n=0, n=1, n=3
    assert await r.zcard(q.keys.delayed) == 1
    assert await q.cancel_delayed("later-1") is True
    await r.aclose()
