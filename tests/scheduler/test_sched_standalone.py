"""The standalone scheduler (and promoter) process for producer-only deployments."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from engine_support import wait_until_sync
from sched_support import fires

from airflow_provider_chasqui import RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


def launch(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_chasqui.engine.scheduler", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate(timeout=20)
    return proc.returncode, err.decode()


def test_standalone_scheduler_and_promoter(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    k = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.upsert_repeatable_job("beat", {"b": 1}, repeat=RepeatPattern.every(400))
        q.add("later", {"l": 1}, delay_ms=300)
        proc = launch("--queue", queue_name, "--redis-url", redis_url, "--promoter")
        try:
            wait_until_sync(
                lambda: len([f for f in fires(r, queue_name) if f.name == "beat"]) >= 3,
                15,
                what="three fires from the standalone scheduler",
            )
            wait_until_sync(
                lambda: any(f.name == "later" for f in fires(r, queue_name)),
                15,
                what="the delayed job promoted by the standalone promoter",
            )
            assert r.get(k.scheduler_lock).startswith(b"s-") and r.get(k.promoter_lock).startswith(b"p-")
        finally:
            code, err = stop(proc)
    assert code == 0, err
    assert r.get(k.scheduler_lock) is None and r.get(k.promoter_lock) is None  # released on SIGTERM


def test_standalone_scheduler_serves_every_shard(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    with SyncShardedQueue(queue_name, 3, redis_url=redis_url) as sq:
        sq.upsert_repeatable_bulk([{"name": f"n{i}", "data": i, "repeat": RepeatPattern.every(300)} for i in range(12)])
        proc = launch("--queue", queue_name, "--shards", "3", "--redis-url", redis_url, "--tick-ms", "500")
        try:
            wait_until_sync(
                lambda: all(r.xlen(QueueKeys.for_queue(f"{queue_name}.{i}").stream) >= 4 for i in range(3)),
                15,
                what="fires on every shard",
            )
        finally:
            code, err = stop(proc)
        for i in range(3):
            for key in r.scan_iter(match=f"{{chasqui:{queue_name}.{i}}}*"):
                r.delete(key)
    assert code == 0, err
