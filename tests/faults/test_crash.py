"""Crash: a worker SIGKILLed mid-batch loses nothing; a second worker finishes its work.

50,000 jobs are queued; worker A (a subprocess) is SIGKILLed once it has run a fifth of
them, with handlers running, acks buffered and a read batch in its deque.  Its pending
entries (the in-flight set) are read from XPENDING right after the kill.  Worker B, started
afterwards with ``claim_min_idle_ms=1000``, reclaims them and drains the stream.

Proven: every job ran at least once, none is lost, the stream and its PEL end empty, and
every job that ran twice is in A's in-flight set (at-least-once, duplicates only there).
"""

from __future__ import annotations

import time

import pytest
from engine_support import raw_sync, wait_until_sync
from fault_support import chunks, count_lines, indexes_of_entries, pending_ids, read_records, spawn_worker

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

N = 50_000


def _drained(r, stream: str) -> bool:
    summary = r.execute_command("XPENDING", stream, "default")
    return int(r.execute_command("XLEN", stream)) == 0 and int(summary[0]) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_mid_batch_loses_nothing(redis_url: str, queue_name: str, tmp_path) -> None:
    keys = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for part in chunks(list(range(N)), 5000):
            q.add_bulk([{"name": "crash", "data": {"i": i}} for i in part])
    t0 = time.monotonic()
    a = spawn_worker(redis_url, queue_name, tmp_path / "a.rec", "crash-a", handler_sleep_ms=2, concurrency=100)
    b = None
    try:
        wait_until_sync(
            lambda: count_lines(a.out) >= N // 5 or not a.alive(), 90, what="worker A to run N/5 jobs", interval=0.005
        )
        assert a.alive(), a.log_tail()
        a.kill()
        done_by_a_at_kill = count_lines(a.out)
        with raw_sync(redis_url) as r:
            r.response_callbacks.clear()
            inflight_ids = pending_ids(r, keys.stream, "default", "crash-a")
            inflight = set(indexes_of_entries(r, keys.stream, inflight_ids).values())
        assert len(inflight) == len(inflight_ids), "a pending entry of A vanished from the stream"
        assert inflight, "the kill found nothing in flight: it did not hit mid-batch"

        b = spawn_worker(redis_url, queue_name, tmp_path / "b.rec", "crash-b", claim_min_idle_ms=1000)
        with raw_sync(redis_url) as r:
            r.response_callbacks.clear()
            wait_until_sync(
                lambda: _drained(r, keys.stream) or not b.alive(),
                180,
                what="worker B to drain stream and PEL",
                interval=0.05,
            )
            assert b.alive(), b.log_tail()
            dlq = int(r.execute_command("XLEN", keys.dlq))
        assert b.stop() == 0, b.log_tail()
    finally:
        a.kill()
        if b is not None:
            b.kill()
    elapsed = time.monotonic() - t0

    rec = read_records([a.out, b.out])
    missing = set(range(N)) - set(rec.counts)
    assert not missing, f"{len(missing)} jobs never ran, e.g. {sorted(missing)[:10]}"
    assert set(rec.counts) == set(range(N))
    dups = set(rec.duplicates)
    assert dups <= inflight, f"duplicates outside A's in-flight set: {sorted(dups - inflight)[:10]}"
    assert max(rec.counts.values()) <= 2
    assert dlq == 0
    ran_by_a = len(rec.by_consumer["crash-a"])
    print(
        f"\n[crash] jobs={N} ran_by_A_before_kill={done_by_a_at_kill} A_in_flight_at_kill={len(inflight)} "
        f"ran_by_B={len(rec.by_consumer['crash-b'])} duplicates={len(dups)} "
        f"(all within A's in-flight set; A had run {ran_by_a}) lost=0 elapsed={elapsed:.1f}s"
    )
