"""The drivers' streamed calls (``core.calls.Stream``), which bulk upserts and the scheduler use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from servers import start_server

from airflow_provider_chasqui.core.calls import Call, Stream, command, script_call
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.sync._driver import SyncDriver


def calls(key: str, n: int, fail_at: int | None = None) -> Iterator[Call]:
    for i in range(n):
        if i == fail_at:
            raise ValueError("bad item")
        yield command("RPUSH", key, i)


@pytest.fixture
def private_url(tmp_path: Path) -> Iterator[str]:
    """A server of this test's own: it flushes the script cache."""
    server = start_server("redis7", tmpdir=tmp_path)
    yield server.url
    server.stop()


def test_sync_stream_runs_calls_in_order_and_survives_a_producer_error(private_url: str, queue_name: str) -> None:
    redis_url = private_url
    key = QueueKeys.for_queue(queue_name).prefix + ":list"
    d = SyncDriver(redis_url)
    try:
        assert d.stream(calls(key, 5)) == [1, 2, 3, 4, 5]
        with pytest.raises(ValueError, match="bad item"):
            d.stream(calls(key, 10, fail_at=3))
        with redis.Redis.from_url(redis_url) as r:
            assert r.lrange(key, 0, -1) == [b"0", b"1", b"2", b"3", b"4", b"0", b"1", b"2"]  # sent ones ran
            r.script_flush()
        lock = QueueKeys.for_queue(queue_name).scheduler_lock
        got = d.run(
            _flow(
                Stream(
                    [
                        script_call("acquire_lock", (lock,), ("a", 5)),
                        command("LLEN", key),
                        script_call("acquire_lock", (lock,), ("b", 5)),
                    ]
                )
            )
        )
        assert got == [1, 8, 0]  # NOSCRIPT: loaded and the missing calls re-run
        assert d.call(command("PING")) == b"PONG"  # the pooled connection is clean
    finally:
        d.close()


async def test_async_stream_is_the_same(redis_url: str, queue_name: str) -> None:
    key = QueueKeys.for_queue(queue_name).prefix + ":list"
    d = AsyncDriver(redis_url)
    try:
        assert await d.stream(calls(key, 3)) == [1, 2, 3]
        with pytest.raises(ValueError):
            await d.stream(calls(key, 10, fail_at=2))
        assert await d.call(command("LLEN", key)) == 5
        assert await d.run(_flow(Stream(iter([])))) == []
    finally:
        await d.close()


def _flow(step: Stream):  # a one-step core flow
    reply = yield step
    return reply
