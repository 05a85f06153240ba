"""Helpers shared by the engine, Lua and sync suites: deadline waits and a worker harness.

Tests never sleep to synchronise: they wait for a condition with ``wait_until`` (or its
blocking twin), which fails loudly with what it was waiting for once the deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from airflow_provider_chasqui.core.codec import decode_envelope
from airflow_provider_chasqui.core.consumer import ConsumerCore
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.retry import RetryPolicy
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.core.urls import split_cluster_flag

__all__ = [
    "wait_until",
    "wait_until_sync",
    "running",
    "fields_of",
    "events_of",
    "kv",
    "raw_async",
    "raw_sync",
    "pending_count",
    "client_lists",
    "consumer_core",
]


async def wait_until(cond: Callable[[], Any], timeout: float = 15.0, *, what: str = "", interval: float = 0.01) -> Any:
    """Re-check ``cond`` (sync or async) until it is truthy; return its value.

    Raises AssertionError naming ``what`` once ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}; last value {value!r}")
        await asyncio.sleep(interval)


def wait_until_sync(cond: Callable[[], Any], timeout: float = 15.0, *, what: str = "", interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}; last value {value!r}")
        time.sleep(interval)


def late_and_losing_the_cancel(
    real: Callable[..., Any], is_read: Callable[..., bool], *, sending: asyncio.Event | None = None, delay: float = 0.3
) -> Callable[..., Any]:
    """``real`` (a client's ``execute_command``, a driver's ``call``) with the calls ``is_read``
    picks reaching it ``delay`` s late and losing a cancel that lands meanwhile, as a send
    through ``asyncio.wait_for`` can on Python 3.11; ``sending`` is set as one starts."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        if is_read(*args):
            if sending is not None:
                sending.set()
            until = time.monotonic() + delay
            while (left := until - time.monotonic()) > 0:
                try:
                    await asyncio.sleep(left)
                except asyncio.CancelledError:
                    pass  # lost; the send goes on
        return await real(*args, **kwargs)

    return call


@contextlib.asynccontextmanager
async def running(worker: Any, *, stop_timeout: float = 30.0) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker.run()`` as a task; on exit close it and await the drain (errors surface)."""
    task = asyncio.create_task(worker.run(), name="test-worker")
    try:
        yield task
    finally:
        await worker.close()
        done, _ = await asyncio.wait([task], timeout=stop_timeout)
        if not done:  # say where it is stuck: every task's stack, then fail
            for t in asyncio.all_tasks():
                t.print_stack(file=sys.stderr)
            task.cancel()
            raise TimeoutError(f"the worker did not stop within {stop_timeout} s (task stacks on stderr)")
        task.result()


def raw_async(url: str) -> aioredis.Redis:
    """A binary-safe asyncio client (redis-py's reply reshaping is kept: it is only for inspecting).

    ``?cluster=true`` gives a RedisCluster, which routes each command by its key's slot.
    """
    url, cluster = split_cluster_flag(url)
    if cluster:
        return aioredis.RedisCluster.from_url(url, decode_responses=False)  # type: ignore[return-value]
    return aioredis.Redis.from_url(url, decode_responses=False)


def raw_sync(url: str) -> redis.Redis:
    url, cluster = split_cluster_flag(url)
    if cluster:
        return redis.RedisCluster.from_url(url, decode_responses=False)  # type: ignore[return-value]
    return redis.Redis.from_url(url, decode_responses=False)


async def client_lists(client: aioredis.Redis) -> list[dict[str, Any]]:
    """CLIENT LIST of the server, or of every node of a cluster, as one list."""
    if isinstance(client, aioredis.RedisCluster):
        per_node = await client.client_list(target_nodes=aioredis.RedisCluster.ALL_NODES)
        return [c for clients in per_node.values() for c in clients]
    return await client.client_list()


def kv(fields: Any) -> list[tuple[str, bytes]]:
    """An entry's fields as an ordered list of (name, raw value); accepts a dict or a flat list."""
    if isinstance(fields, dict):
        items = list(fields.items())
    else:
        items = [(fields[i], fields[i + 1]) for i in range(0, len(fields), 2)]
    return [(k.decode() if isinstance(k, bytes) else k, v) for k, v in items]


def fields_of(entry: Any) -> dict[str, str]:
    """An event entry's fields as str -> str (order kept by dict)."""
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in kv(entry[1])}


async def events_of(client: aioredis.Redis, queue: str) -> list[dict[str, str]]:
    return [fields_of(e) for e in await client.xrange(QueueKeys.for_queue(queue).events)]


async def pending_count(client: aioredis.Redis, queue: str, group: str = "default") -> int:
    k = QueueKeys.for_queue(queue)
    try:
        info = await client.xpending(k.stream, group)
    except redis.ResponseError:
        return 0
    return int(info["pending"])


# ---- the driver lanes' tests (tests/engine/test_engine_lane.py, tests/sync/test_sync_lane.py) ----
def stream_entries(url: str, queue: str) -> list[tuple[bytes, dict[str, bytes]]]:
    """The queue's stream as ``(entry id, {field: raw value})``, oldest first."""
    with redis.Redis.from_url(url) as r:
        return [(eid, dict(kv(fields))) for eid, fields in r.xrange(QueueKeys.for_queue(queue).stream)]


def stream_job_ids(url: str, queue: str) -> list[str]:
    return [decode_envelope(f["d"]).id for _eid, f in stream_entries(url, queue)]


def client_at(url: str, host: str, port: int) -> dict:
    """The server's CLIENT LIST entry of the connection whose local address is ``host:port``."""
    with redis.Redis.from_url(url) as r:
        found = [c for c in r.client_list() if c["addr"] == f"{host}:{port}"]
    assert len(found) == 1, found
    return found[0]


def pool_connections(driver: Any) -> int:
    """Connections the driver's redis-py pool has made (0: every call took the lane)."""
    pool = driver.client.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


def consumer_core(
    queue: str,
    *,
    group: str = "default",
    consumer_id: str = "c-test",
    max_attempts: int = 3,
    failure_ttl_ms: int = 0,
    result_ttl_ms: int = 0,
) -> ConsumerCore:
    """A sans-I/O consumer core with default settings and retry policy, events on, no results."""
    return ConsumerCore(
        queue,
        group=group,
        consumer_id=consumer_id,
        max_attempts=max_attempts,
        settings=QueueSettings(),
        retry=RetryPolicy(),
        events=True,
        result_ttl_ms=result_ttl_ms,
        failure_ttl_ms=failure_ttl_ms,
    )
