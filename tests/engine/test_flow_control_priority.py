"""Job priorities (issue 24): ``add(..., priority=p)``, 1 the most urgent.

Real servers (Redis 7.0 and Valkey 8.1) and a worker *process* at concurrency 1 that records
the order its handlers start: every waiting job of a lower number starts before any of a higher
number, FIFO within each, and jobs without a priority first.  The scripts are also driven with
hostile members, a hostile controls key and wrong types.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync
from fault_support import read_records, spawn_worker

from airflow_provider_chasqui import ConfigError, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.priorities import take_prioritized_call
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(300)


def start_order(path: Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_one_worker_runs_lower_numbers_first_fifo_within_each(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """300 jobs of priorities 1..10 added in a shuffled order (one at a time and in bulk), and
    20 without a priority: one worker at concurrency 1 starts the 20 first (in the order they
    were added), then every priority-1 job, then every priority-2 job, ... each in the order
    it was added."""
    url = matrix_url.url
    rng = random.Random(24)
    plan = [(i, rng.randint(1, 10)) for i in range(300)]
    with SyncQueue(queue_name, redis_url=url) as q:
        for i, p in plan[:100]:
            q.add("p", {"i": i}, priority=p)
        q.add_bulk([{"name": "p", "data": {"i": i}, "priority": p} for i, p in plan[100:]])
        q.add_bulk([{"name": "p", "data": {"i": 1000 + k}} for k in range(20)])
        w = spawn_worker(url, queue_name, tmp_path / "w.rec", "prio", starts=tmp_path / "w.starts", concurrency=1)
        try:
            wait_until_sync(lambda: len(start_order(tmp_path / "w.starts")) >= 320, 120, what="every job")
        finally:
            w.stop()
    order = start_order(tmp_path / "w.starts")
    priority = dict(plan)
    expected = [1000 + k for k in range(20)] + [i for i, _ in sorted(plan, key=lambda ip: (ip[1], ip[0]))]
    assert order == expected, [(i, priority.get(i)) for i in order[:40]]
    assert max(read_records([tmp_path / "w.rec"]).counts.values()) == 1


def test_an_urgent_job_overtakes_the_waiting_ones(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """While a worker (concurrency 1) drains priority-5 jobs of 50 ms each, a priority-1 job
    added midway starts next: a worker on a queue that uses priorities reads no job ahead."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add_bulk([{"name": "p", "data": {"i": i}, "priority": 5} for i in range(60)])
        w = spawn_worker(
            redis_url,
            queue_name,
            tmp_path / "w.rec",
            "urgent",
            starts=tmp_path / "w.starts",
            concurrency=1,
            handler_sleep_ms=50,
        )
        try:
            wait_until_sync(lambda: len(start_order(tmp_path / "w.starts")) >= 10, 60, what="ten jobs")
            before = len(start_order(tmp_path / "w.starts"))
            q.add("p", {"i": 999}, priority=1)
            wait_until_sync(lambda: 999 in start_order(tmp_path / "w.starts"), 60, what="the urgent job")
            at = start_order(tmp_path / "w.starts").index(999)
            wait_until_sync(lambda: len(start_order(tmp_path / "w.starts")) >= 61, 120, what="every job")
        finally:
            w.stop()
    # at most the job running when it was added and one taken meanwhile came before it
    assert at <= before + 1, (at, before)


def test_bad_priorities_are_config_errors(redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for bad in (0, -1, True, 1.5, "1", 2**16 + 1, float("nan")):
            with pytest.raises(ConfigError, match="priority"):
                q.add("p", 1, priority=bad)
            with pytest.raises(ConfigError, match="priority"):
                q.add_bulk([{"name": "p", "data": 1, "priority": bad}])
        for other in ({"delay": 1000}, {"job_id": "j-1"}):
            with pytest.raises(ConfigError, match="priority"):
                q.add("p", 1, priority=3, **other)


@pytest.mark.single_node("writes the keys with a plain client")
def test_hostile_prioritized_members_and_keys(redis_url: str, queue_name: str) -> None:
    """A member that does not split into name and envelope reaches the stream whole (the
    workers' gate dead-letters it); a set of another type moves nothing; a controls key of
    another type is replaced by the next prioritized add."""
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(redis_url)
    try:
        with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as q:
            r.set(keys.prioritized, b"not a zset")
            assert driver.call(take_prioritized_call(keys, 5, 1000)) == 0
            r.set(keys.controls, b"\xff not a hash")
            q.add("p", {"ok": 1}, priority=2)  # both hostile keys replaced
            assert r.type(keys.controls) == b"hash" and r.zcard(keys.prioritized) == 1
            r.zadd(keys.prioritized, {b"\x01": 0, b"\xff\xff\xff\x7fname": 1})  # short, and a length past the end
            assert driver.call(take_prioritized_call(keys, 10, 1000)) == 3
            entries = r.xrange(keys.stream)
            assert [e[1][b"d"] for e in entries[:2]] == [b"\x01", b"\xff\xff\xff\x7fname"]  # whole, for the gate
            assert r.xlen(keys.stream) == 3 and r.zcard(keys.prioritized) == 0
    finally:
        driver.close()
