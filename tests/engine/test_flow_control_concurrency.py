"""The queue's global concurrency limit (issue 24): ``Queue.set_concurrency(n)``.

Real servers (Redis 7.0 and Valkey 8.1) and worker *processes* that record each handler's start
and end with its wall-clock time: at no instant do more than ``n`` handlers run, over all
workers; a worker SIGKILLed while it holds every slot gives them back a lease and a tenth after
its last renewal, and the jobs it had read ahead are reclaimed soon after.
``take_starts.lua`` is also driven directly: slots, their lapse, the rate limit beside them,
and hostile values in the controls and in the running set.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from engine_support import running, wait_until_sync
from fault_support import WorkerGroup, read_records, spawn_worker

from airflow_provider_chasqui import ConfigError, SyncQueue, SyncShardedQueue
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.core.codec import decode_data, decode_envelope
from airflow_provider_chasqui.core.controls import free_slots_call, parse_take, take_starts_call
from airflow_provider_chasqui.core.keys import DEFAULT_GROUP, QueueKeys
from airflow_provider_chasqui.errors import ConfigTypeError
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(300)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of ``(start, end)`` intervals that overlap at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = top = 0
    for _, step in edges:
        now += step
        top = max(top, now)
    return top


def intervals(group: WorkerGroup) -> list[tuple[float, float]]:
    """Each handler run as (start, end), matched by job index and consumer (every job runs once)."""
    starts = {(r[0], r[2]): float(r[3]) for r in group.start_rows()}
    return [(starts[(r[0], r[2])], float(r[3])) for r in group.end_rows()]


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_three_workers_never_run_more_than_the_limit(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """Three worker processes (20 slots each) on a queue limited to 4: handlers of 20 ms never
    overlap more than 4 at once, reach 4, every job runs once, and no slot is left behind."""
    url, n, limit = matrix_url.url, 300, 4
    keys = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        q.set_concurrency(limit)
        assert q.get_concurrency() == limit
        q.add_bulk([{"name": "c", "data": {"i": i}} for i in range(n)])
        group = WorkerGroup.spawn(url, queue_name, tmp_path, "conc", concurrency=20, handler_sleep_ms=20)
        sampled = []
        try:

            def done() -> bool:
                sampled.append(r.zcard(keys.running))
                return group.ended() >= n

            wait_until_sync(done, 120, what="every job under the limit", interval=0.01)
        finally:
            group.stop()
        rec = read_records(group.records)
        assert sorted(rec.counts) == list(range(n)) and max(rec.counts.values()) == 1
        assert max(sampled) <= limit, max(sampled)
        assert most_at_once(intervals(group)) == limit
        assert r.zcard(keys.running) == 0  # every slot freed with its job's ack


LEASE_MS = 3000
HOLD_SECS = LEASE_MS * 1.1 / 1000  # Intake.hold_ms: how long a slot or an entry outlives its last renewal


@dataclass
class KilledHolder:
    """What B started after A was killed: each job's start, seconds after the kill; the jobs A
    had read (running or held); and how many ran at once at most."""

    starts: dict[int, float]
    a_jobs: set[int]
    most_at_once: int


def kill_the_slot_holder(url: str, queue_name: str, tmp_path: Path, limit: int, short_ms: int) -> KilledHolder:
    """A queue limited to ``limit``: worker A runs ``limit`` slow jobs and has read one of 20
    short jobs ahead (``read_count=1``); worker B holds the other 19 (``short_ms`` each) for a
    slot and starts none in a second.  A is SIGKILLed and B runs every job, each once."""
    keys = QueueKeys.for_queue(queue_name)
    total = limit + 20
    with SyncQueue(queue_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        pending_of = functools.partial(_pending_of, r, keys)
        q.set_concurrency(limit)
        q.add_bulk([{"name": "s", "data": {"i": i, "slow": True}} for i in range(limit)])
        a = spawn_worker(
            url,
            queue_name,
            tmp_path / "a.rec",
            "holder-a",
            starts=tmp_path / "a.starts",
            slow_ms=120_000,
            claim_min_idle_ms=LEASE_MS,
            read_count=1,  # A's read-ahead: concurrency + read_count entries, the last held for a slot
        )
        b = None
        try:
            wait_until_sync(lambda: _lines(tmp_path / "a.starts") == limit, 60, what="A to start the slow jobs")
            q.add_bulk([{"name": "s", "data": {"i": i}} for i in range(limit, total)])
            wait_until_sync(lambda: len(pending_of("holder-a")) == limit + 1, 60, what="A to read one job ahead")
            b = spawn_worker(
                url,
                queue_name,
                tmp_path / "b.rec",
                "holder-b",
                starts=tmp_path / "b.starts",
                handler_sleep_ms=short_ms,
                claim_min_idle_ms=LEASE_MS,
            )
            wait_until_sync(lambda: len(pending_of("holder-b")) == 19, 60, what="B to read the other 19")
            time.sleep(1.0)  # B holds its jobs for a while: the slots are A's (a hold, not a wait)
            assert _lines(tmp_path / "b.starts") == 0
            index = _job_indexes(r, keys)
            a_jobs = {index[eid] for eid in pending_of("holder-a")}
            assert set(range(limit)) < a_jobs and len(a_jobs) == limit + 1, a_jobs
            killed = time.time()
            a.kill()
            wait_until_sync(lambda: _lines(tmp_path / "b.rec") >= total, 90, what="B to run every job")
        finally:
            a.kill()
            if b is not None:
                b.stop()
    rows = [line.split() for line in (tmp_path / "b.starts").read_text().splitlines()]
    rec = read_records([tmp_path / "b.rec"])
    assert sorted(rec.counts) == list(range(total)) and max(rec.counts.values()) == 1
    ends = {r[0]: float(r[3]) for r in (line.split() for line in (tmp_path / "b.rec").read_text().splitlines())}
    return KilledHolder(
        starts={int(row[0]): float(row[3]) - killed for row in rows},
        a_jobs=a_jobs,
        most_at_once=most_at_once([(float(r[3]), ends[r[0]]) for r in rows]),
    )


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_killed_worker_gives_its_slots_back_within_a_lease(matrix_url, queue_name: str, tmp_path: Path) -> None:
    """A queue limited to 2: worker A holds both slots (two slow jobs) and has read one short
    job ahead; worker B holds the other 19 short jobs (20 ms).  A is SIGKILLed.  Two things come
    back, each measured from the kill: the slots, one hold (the lease and a tenth,
    ``Intake.hold_ms``) after A's last renewal, when B starts its own held jobs; and the three
    jobs A had read, once they were idle that long too: B's recovery pass saw them about to
    lapse and came back for them as they did.  Never more than 2 run at once, and every job
    completes once."""
    run = kill_the_slot_holder(matrix_url.url, queue_name, tmp_path, limit=2, short_ms=20)
    own = sorted(t for i, t in run.starts.items() if i not in run.a_jobs)
    # the slots: A's lapse a hold after its last renewal (at most a tenth of a lease before the
    # kill), then B's next poll (50 ms) grants them: 3.0-3.35 s idle; a slot that never lapsed
    # would take the whole 90 s wait
    assert own[0] <= HOLD_SECS + 1.0, own[0]
    # A's three jobs: reclaimed as they lapse, a hold after A's last renewal: 3.06-3.38 s (at
    # B's next pass every half lease, as before, they took 3.30-3.61 s)
    a_starts = {i: run.starts[i] for i in run.a_jobs}
    assert max(a_starts.values()) <= HOLD_SECS + 1.0, a_starts
    assert run.most_at_once <= 2


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_a_dead_workers_jobs_do_not_wait_behind_a_survivors_held_backlog(
    matrix_url, queue_name: str, tmp_path: Path
) -> None:
    """A queue limited to 1: worker A runs a slow job and has read one more ahead; worker B
    holds the other 19 jobs (400 ms each) for the slot.  A is SIGKILLed.  B's recovery runs
    while it holds jobs: A's two jobs are reclaimed a hold after A's last renewal and start
    next, not after B's 7.6 s backlog (before the fix they waited for B to hold nothing)."""
    run = kill_the_slot_holder(matrix_url.url, queue_name, tmp_path, limit=1, short_ms=400)
    a_starts = {i: run.starts[i] for i in run.a_jobs}
    # reclaimed as they lapse, a hold after A's last renewal, and started as B's running job
    # ends: 3.02-3.24 s (4.75-4.91 s at B's next pass every half lease; 10.8-11.2 s after B's
    # backlog, before the fix)
    assert min(a_starts.values()) <= HOLD_SECS + 1.0, a_starts
    assert max(a_starts.values()) < max(run.starts.values()), run.starts  # not last either
    assert run.most_at_once <= 1


def _pending_of(r: redis.Redis, keys: QueueKeys, consumer: str) -> set[bytes]:
    """The entries pending to ``consumer``."""
    rows = r.xpending_range(keys.stream, DEFAULT_GROUP, min="-", max="+", count=100, consumername=consumer)
    return {row["message_id"] for row in rows}


def _job_indexes(r: redis.Redis, keys: QueueKeys) -> dict[bytes, int]:
    """Each stream entry's job index (``data["i"]``, from the entry's envelope)."""
    return {eid: decode_data(decode_envelope(fields[b"d"]).inner)["i"] for eid, fields in r.xrange(keys.stream)}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def take(driver: SyncDriver, keys: QueueKeys, ids: list[bytes], lease_ms: int = 30_000) -> tuple[int, int, bool]:
    return parse_take(driver.call(take_starts_call(keys, ids, lease_ms)), len(ids))[:3]


def test_take_starts_counts_slots(redis_url: str, queue_name: str) -> None:
    """Slots: a prefix is granted up to the limit; an entry that holds a slot keeps it when
    offered again; a freed slot is taken by the next; a slot past its lease is purged."""
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(redis_url)
    try:
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            q.set_concurrency(3)
            assert take(driver, keys, [b"1-0", b"2-0", b"3-0", b"4-0"]) == (3, 0, True)
            assert take(driver, keys, [b"2-0", b"1-0", b"4-0"]) == (2, 0, True)  # held again: theirs
            driver.call(free_slots_call(keys, [b"1-0"]))
            assert take(driver, keys, [b"4-0", b"5-0"]) == (1, 0, True)
            assert take(driver, keys, [b"6-0"], lease_ms=1) == (0, 0, True)
            driver.call(free_slots_call(keys, [b"2-0", b"3-0", b"4-0"]))
            assert take(driver, keys, [b"6-0", b"7-0"], lease_ms=1) == (2, 0, True)  # two slots that lapse at once
            wait_until_sync(lambda: take(driver, keys, [b"8-0", b"9-0"])[0] == 2, 10, what="the lapsed slots")
            assert driver.call(command("ZCARD", keys.running)) == 2
            q.set_concurrency(None)
            assert q.get_concurrency() is None
            assert take(driver, keys, [b"10-0"] * 5) == (5, 0, False)
    finally:
        driver.close()


def test_a_job_without_a_slot_takes_no_rate_grant(redis_url: str, queue_name: str) -> None:
    """Both limits at once: the rate limit counts only what found a slot."""
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(redis_url)
    try:
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            q.set_concurrency(2)
            q.set_rate_limit(3, 60_000)
            assert take(driver, keys, [b"1-0", b"2-0", b"3-0"]) == (2, 0, True)
            assert driver.call(command("HGET", keys.rate, "n")) == b"2"
            driver.call(free_slots_call(keys, [b"1-0", b"2-0"]))
            granted, wait_ms, _ = take(driver, keys, [b"3-0", b"4-0"])
            assert granted == 1 and 0 < wait_ms <= 60_000  # the rate holds the second back
            assert driver.call(command("ZCARD", keys.running)) == 1  # and it took no slot
    finally:
        driver.close()


@pytest.mark.single_node("writes the controls with a plain client")
@pytest.mark.parametrize(
    ("value", "limited"),
    [
        (b"2", True),
        (b"0", False),
        (b"-2", False),
        (b"inf", False),
        (b"nan", False),
        (b"2.5", False),
        (b"1e3", False),
        (b"\xff\x00", False),
        (b"9" * 13, False),
    ],
)
def test_hostile_concurrency_is_no_limit(redis_url: str, queue_name: str, value: bytes, limited: bool) -> None:
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        r.hset(keys.controls, "concurrency", value)
        r.set(keys.running, b"\xff not a sorted set")  # hostile state: replaced, never an error
    driver = SyncDriver(redis_url)
    try:
        assert take(driver, keys, [b"1-0", b"2-0", b"3-0"])[0] == (2 if limited else 3)
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            assert (q.get_concurrency() is not None) is limited
    finally:
        driver.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", float("inf"), float("nan"), 10**7])
def test_bad_concurrency_is_a_config_error(redis_url: str, queue_name: str, bad) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q, pytest.raises(ConfigError, match="concurrency"):
        q.set_concurrency(bad)


def test_a_sharded_queue_splits_its_limits(redis_url: str, queue_name: str) -> None:
    """Each shard obeys its share; the shares sum to the whole, read back as one."""
    with SyncShardedQueue(queue_name, shards=3, redis_url=redis_url) as sq:
        sq.set_concurrency(10)
        assert [q.get_concurrency() for q in sq.queues] == [4, 3, 3] and sq.get_concurrency() == 10
        sq.set_rate_limit(7, 1000)
        assert [q.get_rate_limit().max_jobs for q in sq.queues] == [3, 2, 2]  # type: ignore[union-attr]
        assert sq.get_rate_limit() is not None and sq.get_rate_limit().max_jobs == 7  # type: ignore[union-attr]
        with pytest.raises(ConfigError, match="from 3 to 3,000,000, got 2"):
            sq.set_concurrency(2)
        # the bound named is the whole queue's, not one shard's share of the value given
        with pytest.raises(ConfigError, match="from 3 to 3,000,000, got 3000001$"):
            sq.set_concurrency(3_000_001)
        with pytest.raises(ConfigError, match="max_jobs of a queue with 3 shards must be from 3 to 3,000,000,000"):
            sq.set_rate_limit(10**30, 1000)
        with pytest.raises(ConfigTypeError, match="concurrency must be an int, got str"):
            sq.set_concurrency("10")  # type: ignore[arg-type]
        assert [q.get_concurrency() for q in sq.queues] == [4, 3, 3]  # no refused call wrote a share
        sq.clear_concurrency()
        sq.clear_rate_limit()
        assert sq.get_concurrency() is None and sq.get_rate_limit() is None
        sq.set_group_limits(concurrency=2)  # every shard: a group lives on one, by its name
        sq.set_group_limits(concurrency=1, group="acme")
        assert [q.get_group_limits("other").concurrency for q in sq.queues] == [2, 2, 2]
        assert sq.get_group_limits("acme").concurrency == 1
        home = sq.shard_for("acme")
        sq.add("t", 1, group="acme")  # routed by the group's name
        waiting = [q.driver.call(command("LLEN", q.keys.group_jobs("acme"))) for q in sq.queues]
        assert waiting == [int(q is home) for q in sq.queues]


async def test_a_limit_set_while_a_worker_runs_is_obeyed(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """An in-process worker with 10 slots runs 10 at once until the queue's limit is set to 2;
    from then on (within the controls' 100 ms) never more than 2, and every slot is freed."""
    q = queues(queue_name, redis_url)
    now_running, most = 0, []

    async def handler(job):
        nonlocal now_running
        now_running += 1
        most.append((job.data["phase"], now_running))
        await asyncio.sleep(0.03)
        now_running -= 1

    async with running(worker_factory(queue_name, handler, redis_url, concurrency=10)):
        await q.add_bulk([{"name": "a", "data": {"phase": 1}} for _ in range(40)])
        await asyncio.wait_for(_until(lambda: len(most) >= 40), 60)
        await q.set_concurrency(2)
        await asyncio.sleep(0.3)  # past the worker's controls cache (100 ms): the bound under test
        await q.add_bulk([{"name": "b", "data": {"phase": 2}} for _ in range(40)])
        await asyncio.wait_for(_until(lambda: len(most) >= 80 and now_running == 0), 60)
        await asyncio.wait_for(_until_async(lambda: _zcard(q), 0), 30)
    assert max(n for phase, n in most if phase == 1) > 2
    assert max(n for phase, n in most if phase == 2) <= 2


async def _zcard(q) -> int:
    return int(await q.driver.call(command("ZCARD", q.keys.running)))


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


async def _until_async(get, want) -> None:
    while await get() != want:
        await asyncio.sleep(0.02)
