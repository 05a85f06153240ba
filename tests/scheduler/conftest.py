"""Fixtures of the scheduler suite: the server matrix's URL, a raw client and a queue on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airflow_provider_chasqui import SyncQueue


@pytest.fixture
def url(matrix_url: Any) -> str:
    """Redis 7.0, Valkey 8.1 and Redis 8.2 in turn."""
    return matrix_url.url


@pytest.fixture
def r(url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url) as client:
        yield client


@pytest.fixture
def q(url: str, queue_name: str) -> Iterator[SyncQueue]:
    with SyncQueue(queue_name, redis_url=url) as queue:
        yield queue
