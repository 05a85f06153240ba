"""Hostile payloads against a real ``chasqui worker`` with its defaults (issue 26, item 1).

``Queue.add("eat", [{}] * 1_000_000)`` is 1,000,005 bytes on the wire (under the 1 MiB
limit) and 73 MB of Python objects decoded.  The worker used to decode every entry of its
read-ahead window at arrival: 30 such jobs took it to 2.2 GB, and the next worker reclaimed
them and died the same way.  Now the window holds bytes, data is decoded when a job starts,
and data over 64 KiB may hold at most one list or map per 8 bytes (``codec.decode_data``):
these jobs are dead-lettered ``decode_failed`` at a few MB each, and good jobs go on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgpack
import pytest
import redis

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.codec import BYTES_PER_CONTAINER, SMALL_DATA_BYTES, decode_data
from airflow_provider_chasqui.errors import CodecError
from tests.worker.worker_support import WorkerProc

pytestmark = pytest.mark.timeout(300)

PEAK_LIMIT_MB = 400


def _peak_rss_mb(pid: int) -> float:
    """The process's high-water resident set (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_the_decode_bound_refuses_expanding_shapes_and_keeps_real_data() -> None:
    for hostile in ([{}] * 1_000_000, [[{}] * 1000] * 1000, [[]] * 500_000):
        raw = msgpack.packb(hostile)
        with pytest.raises(CodecError, match="one list or map per"):
            decode_data(raw)
    rows = [{"id": i, "name": f"customer {i}", "total": i * 1.5, "tags": ["a", "b"]} for i in range(20_000)]
    assert decode_data(msgpack.packb(rows)) == rows  # record-like data decodes whatever its size
    small = [{}] * (SMALL_DATA_BYTES - 8)  # at most 64 KiB: decoded directly (a few MB at worst)
    assert decode_data(msgpack.packb(small)) == small
    edge = [{}] * 20_000 + ["x" * 200_000]  # over 64 KiB, one container per ~11 bytes: within the budget
    raw = msgpack.packb(edge)
    assert len(raw) > SMALL_DATA_BYTES and len(raw) // BYTES_PER_CONTAINER > 20_001 and decode_data(raw) == edge


def test_a_default_worker_survives_ten_expanding_jobs(shared_redis_url: str, queue_name: str, tmp_path: Path) -> None:
    q = SyncQueue(queue_name, redis_url=shared_redis_url)
    worker = WorkerProc(
        ["--queue", queue_name, "--handlers", "worker_handlers", "--redis-url", shared_redis_url],
        tmp_path / "worker.log",
    )
    try:
        before = [q.add("echo", {"n": i}).id for i in range(5)]
        hostile = [q.add("echo", [{}] * 1_000_000).id for _ in range(10)]
        after = [q.add("echo", {"n": i}).id for i in range(5, 10)]
        results = q.wait_for_results(before + after, timeout=120)
        assert sorted(results) == sorted(before + after), worker.output()[-3000:]
        assert all(r[0] == "completed" for r in results.values())
        deadline = time.monotonic() + 120
        while len([r for r in q.peek_dlq(100) if r["job_id"] in hostile]) < 10:
            assert time.monotonic() < deadline, worker.output()[-3000:]
            assert worker.proc.poll() is None, worker.output()[-3000:]
            time.sleep(0.1)
        dead = [r for r in q.peek_dlq(100) if r["job_id"] in hostile]
        assert {r["reason"] for r in dead} == {"decode_failed"}
        assert all(len(r["payload"]) > 1_000_000 for r in dead)  # the DLQ keeps the job as sent
        peak = _peak_rss_mb(worker.pid)
        print(f"\n[hostile payloads] default worker's peak RSS {peak:.0f} MB (limit {PEAK_LIMIT_MB} MB)")
        assert peak < PEAK_LIMIT_MB
        # and it goes on: a good job after the storm
        assert q.wait_for_result(q.add("echo", {"last": True}).id, timeout=60) == {"echo": {"last": True}}
        assert worker.proc.poll() is None
    finally:
        worker.kill()
        q.close()
        with redis.Redis.from_url(shared_redis_url) as r:
            r.delete(q.keys.dlq)
    assert os.path.exists(tmp_path / "worker.log")


async def test_an_oversize_foreign_entry_is_dead_lettered_inside_redis(tmp_path: Path) -> None:
    """A 64 MB entry written by someone else: the worker reads it once (XREADGROUP) but sends
    none of it back; the DLQ entry, as the wire protocol wants, holds the original bytes, copied
    inside Redis by the dead-letter script.  Measured as the bytes Redis received."""
    from engine_support import running, wait_until
    from servers import start_server

    from airflow_provider_chasqui import Queue, Worker
    from airflow_provider_chasqui.core.keys import QueueKeys

    server = start_server("redis7", tmpdir=tmp_path)
    k = QueueKeys.for_queue("big")
    big = b"\x00" * (64 * 1024 * 1024)
    try:
        with server.client() as r:
            r.xadd(k.stream, {"d": big, "n": "foreign"})
            before = int(r.info("stats")["total_net_input_bytes"])
        seen: list[object] = []
        async with Queue("big", redis_url=server.url) as q:
            w = Worker("big", seen.append, redis_url=server.url, run_scheduler=False, read_block_ms=200)
            async with running(w):
                await wait_until(lambda: _dlq_has(q), 60, what="the entry in the DLQ")
                await q.add("small", 1)
                await wait_until(lambda: len(seen) == 1, 30, what="a good job after it")
        with server.client() as r:
            received = int(r.info("stats")["total_net_input_bytes"]) - before
            ((_eid, fields),) = r.xrange(k.dlq)
        assert received < 1024 * 1024, received  # the payload was not sent back
        assert fields[b"reason"] == b"oversize_payload" and fields[b"d"] == big and fields[b"n"] == b"foreign"
    finally:
        server.stop()


async def _dlq_has(q) -> bool:
    return len(await q.peek_dlq(1)) == 1
