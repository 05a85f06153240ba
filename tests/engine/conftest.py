"""Fixtures of the engine suite: clients, queues and workers that are always closed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from airflow_provider_chasqui import Queue, Worker
from engine_support import raw_async


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], aioredis.Redis]]:
    """``clients(url)``: a raw asyncio client for inspecting a server (closed afterwards)."""
    made: list[aioredis.Redis] = []

    def make(url: str) -> aioredis.Redis:
        c = raw_async(url)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.aclose()


@pytest.fixture
async def queues() -> AsyncIterator[Callable[..., Queue]]:
    """``queues(name, url, **kw)``: a producer closed at teardown."""
    made: list[Queue] = []

    def make(name: str, url: str, **kwargs: Any) -> Queue:
        q = Queue(name, redis_url=url, **kwargs)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


def make_worker(name: str, handler: Any, url: str, **kwargs: Any) -> Worker:
    """A worker with test-friendly defaults (no embedded cron scheduler unless asked)."""
    kwargs.setdefault("run_scheduler", False)
    kwargs.setdefault("read_block_ms", 1000)
    return Worker(name, handler, redis_url=url, **kwargs)


@pytest.fixture
def worker_factory() -> Callable[..., Worker]:
    return make_worker
