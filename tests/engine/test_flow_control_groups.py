"""Job groups (issue 24): ``add(..., group=...)``, fair turns and per-group limits.

Real servers (Redis 7.0 and Valkey 8.1) and worker *processes* that record each handler's start
(and end) with its wall-clock time: a group's backlog of 100,000 jobs does not hold back 100
small groups; a group never runs more than its concurrency limit, and a killed worker's group
slots come back within a lease; a group's rate limit and its ``RateLimited`` block hold that
group back and no other.  The scripts are also driven with hostile limits, keys and members.
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync
from fault_support import WorkerGroup, read_records, spawn_worker
from test_flow_control_concurrency import most_at_once

from airflow_provider_chasqui import ConfigError, GroupLimits, SyncQueue
from airflow_provider_chasqui.core.groups import take_grouped_call
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(300)


def starts(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_big_backlog_does_not_hold_back_the_small_groups(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Fairness: group "big" has 100,000 waiting jobs (added first) and 100 other groups 10
    each; one worker process starts every small group's jobs before "big" has run 2,000."""
    url, small = matrix_url.url, 100 * 10
    with SyncQueue(queue_name, redis_url=url) as q:
        for c in range(0, 100_000, 10_000):
            q.add_bulk([{"name": "g", "data": {"i": 100_000 + i}, "group": "big"} for i in range(c, c + 10_000)])
        q.add_bulk(
            [{"name": "g", "data": {"i": k * 10 + j}, "group": f"tenant-{k}"} for j in range(10) for k in range(100)]
        )
        w = spawn_worker(url, queue_name, tmp_path / "w.rec", "fair", starts=tmp_path / "w.starts", concurrency=20)
        try:

            def small_done() -> bool:
                return sum(1 for r in starts(tmp_path / "w.starts") if int(r[0]) < small) >= small

            wait_until_sync(small_done, 120, what="every small group's jobs")
        finally:
            w.stop()
        q.obliterate(force=True)
    rows = starts(tmp_path / "w.starts")
    last_small = max(k for k, r in enumerate(rows) if int(r[0]) < small)
    big_before = sum(1 for r in rows[:last_small] if int(r[0]) >= small)
    assert big_before < 2_000, big_before
    per_tenant = collections.Counter(int(r[0]) // 10 for r in rows if int(r[0]) < small)
    assert per_tenant == dict.fromkeys(range(100), 10)
    assert sorted(int(r[0]) for r in rows if int(r[0]) < small) == list(range(small))  # each once


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_three_workers_keep_each_groups_concurrency(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Every group limited to 2 (the default), group "solo" to 1: over three worker processes,
    no group ever runs more than its limit at once, each reaches it, and every job runs once."""
    url = matrix_url.url
    plan = {i: f"g{i % 4}" if i < 160 else "solo" for i in range(200)}
    with SyncQueue(queue_name, redis_url=url) as q:
        q.set_group_limits(concurrency=2)
        q.set_group_limits(concurrency=1, group="solo")
        assert q.get_group_limits("g1") == GroupLimits(concurrency=2)
        assert q.get_group_limits("solo") == GroupLimits(concurrency=1)
        q.add_bulk([{"name": "g", "data": {"i": i}, "group": g} for i, g in plan.items()])
        group = WorkerGroup.spawn(url, queue_name, tmp_path, "gconc", concurrency=20, handler_sleep_ms=25)
        try:
            wait_until_sync(lambda: group.ended() >= len(plan), 120, what="every grouped job")
        finally:
            group.stop()
        with redis.Redis.from_url(url) as r:
            assert not list(r.scan_iter(match=f"{{chasqui:{queue_name}}}:grun:*"))  # every slot freed
    rec = read_records(group.records)
    assert sorted(rec.counts) == sorted(plan) and max(rec.counts.values()) == 1
    starts_at = {(r[0], r[2]): float(r[3]) for r in group.start_rows()}
    by_group: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for r in group.end_rows():
        by_group[plan[int(r[0])]].append((starts_at[(r[0], r[2])], float(r[3])))
    most = {g: most_at_once(iv) for g, iv in by_group.items()}
    assert most == {"g0": 2, "g1": 2, "g2": 2, "g3": 2, "solo": 1}, most


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_killed_worker_gives_its_group_slot_back_within_a_lease(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Group "a" (limit 1): worker A runs its slow job; B, started later, starts none of "a"'s
    other jobs until A is SIGKILLed, then within one lease (3 s) plus 1.5 s."""
    url, lease_ms = matrix_url.url, 3000
    with SyncQueue(queue_name, redis_url=url) as q:
        q.set_group_limits(concurrency=1, group="a")
        q.add("g", {"i": 0, "slow": True}, group="a")
        a = spawn_worker(
            url,
            queue_name,
            tmp_path / "a.rec",
            "ga",
            starts=tmp_path / "a.starts",
            slow_ms=120_000,
            claim_min_idle_ms=lease_ms,
        )
        b = None
        try:
            wait_until_sync(lambda: len(starts(tmp_path / "a.starts")) == 1, 60, what="A to start the slow job")
            q.add_bulk([{"name": "g", "data": {"i": i}, "group": "a"} for i in range(1, 6)])
            b = spawn_worker(
                url, queue_name, tmp_path / "b.rec", "gb", starts=tmp_path / "b.starts", claim_min_idle_ms=lease_ms
            )
            time.sleep(2.0)  # B polls the group's turn meanwhile; the slot is A's (a hold, not a wait)
            assert starts(tmp_path / "b.starts") == [] and len(starts(tmp_path / "a.starts")) == 1
            killed = time.time()
            a.kill()
            wait_until_sync(lambda: len(starts(tmp_path / "b.starts")) >= 6, 60, what="B to run group a")
        finally:
            a.kill()
            if b is not None:
                b.stop()
    first = min(float(r[3]) for r in starts(tmp_path / "b.starts"))
    assert first - killed <= lease_ms / 1000 + 1.5, first - killed
    assert sorted(int(r[0]) for r in starts(tmp_path / "b.starts")) == list(range(6))  # A's job too, reclaimed


def test_a_groups_rate_limit_holds_that_group_only(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """Group "a" limited to 5 per 500 ms, group "b" unlimited: b's 40 jobs all start while a's
    40 spread over eight aligned windows (at least seven windows, 3 s, from first to last)."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.set_group_limits(max_jobs=5, per_ms=500, group="a")
        assert q.get_group_limits("a") == GroupLimits(max_jobs=5, per_ms=500)
        q.add_bulk([{"name": "g", "data": {"i": i}, "group": "a" if i < 40 else "b"} for i in range(80)])
        w = spawn_worker(redis_url, queue_name, tmp_path / "w.rec", "grate", starts=tmp_path / "w.starts")
        try:
            wait_until_sync(lambda: len(starts(tmp_path / "w.starts")) >= 80, 60, what="every job")
        finally:
            w.stop()
    rows = starts(tmp_path / "w.starts")
    a = sorted(float(r[3]) for r in rows if int(r[0]) < 40)
    b = sorted(float(r[3]) for r in rows if int(r[0]) >= 40)
    assert a[-1] - a[0] >= 2.95, a[-1] - a[0]
    assert b[-1] < a[0] + 1.0  # b was never held behind a's windows
    windows = collections.Counter(int(t * 1000) // 500 for t in a)
    assert max(windows.values()) <= 10  # at most two windows' grants show in one


def test_rate_limited_blocks_its_group_only(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """A job of group "a" (one running at a time) raises ``RateLimited(1500)``: a starts
    nothing for 1.5 s (the job runs again after, first, still attempt 0) while group "b" goes on."""
    marker = tmp_path / "raised"
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.set_group_limits(concurrency=1, group="a")
        q.add("g", {"i": 0, "rate_limited_ms": 1500}, group="a")
        q.add_bulk([{"name": "g", "data": {"i": i}, "group": "a"} for i in range(1, 5)])
        w = spawn_worker(
            redis_url,
            queue_name,
            tmp_path / "w.rec",
            "gblk",
            starts=tmp_path / "w.starts",
            marker=marker,
            handler_sleep_ms=5,
        )
        try:
            wait_until_sync(marker.exists, 60, what="the RateLimited raise")
            q.add_bulk([{"name": "g", "data": {"i": i}, "group": "b"} for i in range(5, 10)])
            wait_until_sync(lambda: len(read_records([tmp_path / "w.rec"]).counts) >= 10, 60, what="every job")
        finally:
            w.stop()
    raised = float(marker.read_text())
    rows = starts(tmp_path / "w.starts")
    a_after = [float(r[3]) for r in rows if int(r[0]) < 5 and float(r[3]) > raised]
    b_times = [float(r[3]) for r in rows if int(r[0]) >= 5]
    assert a_after and min(a_after) >= raised + 1.5 - 0.05, min(a_after) - raised
    assert max(b_times) < raised + 1.5  # b ran during a's block
    again = [int(r[4]) for r in rows if r[0] == "0"]
    assert again == [0, 0]  # no attempt counted
    assert [r[0] for r in rows if int(r[0]) < 5 and float(r[3]) > raised][0] == "0"  # back at the head


def test_bad_groups_and_limits_are_config_errors(redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for bad in ("", "x" * 129, 5, 1.5, b"bytes", "\udcff"):
            with pytest.raises(ConfigError, match="group"):
                q.add("g", 1, group=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="group"):
            q.add_bulk([{"name": "g", "data": 1, "group": ""}])
        for other in ({"delay": 1000}, {"job_id": "j"}, {"priority": 2}):
            with pytest.raises(ConfigError, match="combined"):
                q.add("g", 1, group="a", **other)
        for kwargs in ({"concurrency": 0}, {"concurrency": True}, {"max_jobs": 5}, {"max_jobs": 5, "per_ms": 0}):
            with pytest.raises(ConfigError, match="concurrency|max_jobs|per_ms"):
                q.set_group_limits(**kwargs)
        with pytest.raises(ConfigError, match="group"):
            q.set_group_limits(concurrency=2, group="y" * 200)


@pytest.mark.single_node("writes the keys with a plain client")
def test_hostile_group_keys_limits_and_members(redis_url: str, queue_name: str) -> None:
    """Hostile limits are no limit; a group list of another type leaves the turn; a member that
    does not split into name and envelope reaches the stream whole, with its group."""
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(redis_url)
    try:
        with redis.Redis.from_url(redis_url) as r, SyncQueue(queue_name, redis_url=redis_url) as q:
            q.add_bulk([{"name": "g", "data": i, "group": "a"} for i in range(3)])
            r.hset(keys.group_limits, mapping={"dc": b"nan", "c:a": b"-1", "r:a": b"5:0", "dr": b"\xff"})
            assert q.get_group_limits("a") == GroupLimits()
            r.set(keys.group_jobs("z"), b"not a list")
            r.zadd(keys.groups, {"z": 0})
            r.rpush(keys.group_jobs("a"), b"\x01")
            assert driver.call(take_grouped_call(keys, 10, 1000, 30_000)) == 4  # a's 4, none of z
            assert r.zcard(keys.groups) == 0 and not r.exists(keys.group_jobs("z"))
            entries = r.xrange(keys.stream)
            assert [f[b"g"] for _e, f in entries] == [b"a"] * 4 and entries[-1][1][b"d"] == b"\x01"
    finally:
        driver.close()


@pytest.mark.single_node("writes the stream with a plain client")
async def test_an_entry_with_a_hostile_group_field_runs_as_ungrouped(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """A stream entry whose ``g`` is not a UTF-8 name (or is too long) runs as a job without a
    group: its slot bookkeeping never builds a key from those bytes, so nothing poisons the
    worker's settling writes."""
    from engine_support import running

    keys = QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    ran: list[int] = []

    async def handler(job):
        ran.append(job.data)

    with redis.Redis.from_url(redis_url) as r:
        for i, g in enumerate((b"\xff\xfe", b"x" * 500, b"")):
            job = await q.add("h", i)
            ((eid, fields),) = r.xrange(keys.stream, "-", "+", count=1)
            r.xdel(keys.stream, eid)
            r.xadd(keys.stream, {**fields, b"g": g})
            assert job.id
        r.hset(keys.controls, "grouped", "1")  # the queue "has groups": the workers track them
    async with running(worker_factory(queue_name, handler, redis_url, concurrency=5)):
        await asyncio.wait_for(_until(lambda: len(ran) == 3), 60)
    assert sorted(ran) == [0, 1, 2]
    with redis.Redis.from_url(redis_url) as r:
        assert r.xlen(keys.dlq) == 0 and r.xinfo_groups(keys.stream)[0]["pending"] == 0


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)
