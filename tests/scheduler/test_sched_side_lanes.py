"""Repeatable specs with a ``priority`` or a ``group`` (issue 24): every fire waits beside the
stream, as a job added with that option does, and runs through the same turn-taking.

Driven on real servers (Redis 7.0, Valkey 8.1, Redis 8.2): the scheduler's ticks write the due
fires into the prioritized set or the group's list (one fire per tick and a fire-all catch-up
of several), never into the stream; a second tick at the same instant fires nothing; a worker
then runs each fire once.  Hostile ``ext`` fields quarantine only their spec, and side keys of
another type are replaced rather than failing the tick.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import redis
from engine_support import running, wait_until
from sched_support import fires
from test_sched_hostile import run_tick

from airflow_provider_chasqui import ConfigError, Job, MissedFiresPolicy, RepeatPattern, SyncQueue, Worker
from airflow_provider_chasqui.core.calls import script_call
from airflow_provider_chasqui.core.codec import Envelope, encode_envelope
from airflow_provider_chasqui.core.groups import MAX_GROUP_BYTES
from airflow_provider_chasqui.core.repeat import StoredSpec
from airflow_provider_chasqui.core.scheduler import fire_job_id
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.parametrize("compat_mode", [False], ids=["auto"], indirect=True),
]
SECOND = 1000
PRIO_UNIT = 2**37


def _members(r: redis.Redis, key: str) -> list[tuple[bytes, float]]:
    return [(m, s) for m, s in r.zrange(key, 0, -1, withscores=True)]


def _job_id(member: bytes) -> str:
    """The job id inside a side-lane member (u32le name length + name + envelope)."""
    n = int.from_bytes(member[:4], "little")
    return msgpack.unpackb(member[4 + n :], raw=False)[0]


async def test_fires_of_a_prioritized_and_a_grouped_spec_wait_beside_the_stream(
    q: SyncQueue, r: redis.Redis, url: str, queue_name: str
) -> None:
    every, catch_up = RepeatPattern.every(SECOND), MissedFiresPolicy.fire_all(5)
    q.upsert_repeatable_job("urgent", {"s": "P"}, repeat=every, key="P", priority=2, missed_fires=catch_up)
    q.upsert_repeatable_job("tenant", {"s": "G"}, repeat=every, key="G", group="tenant-a", missed_fires=catch_up)
    q.upsert_repeatable_job("plain", {"s": "N"}, repeat=every, key="N", missed_fires=catch_up)
    info = q.get_repeatable_job("P")
    assert info is not None and (info.priority, info.group) == (2, None)
    info = q.get_repeatable_job("G")
    assert info is not None and (info.priority, info.group) == (None, "tenant-a")
    scores = {k: int(r.zscore(q.keys.repeat, k)) for k in "PGN"}
    k = q.keys
    d = q.driver
    first = run_tick(d, queue_name, max(scores.values()) + 10)  # one fire each (the short entry for N)
    again = run_tick(d, queue_name, max(scores.values()) + 10)  # same instant: nothing more
    later = run_tick(d, queue_name, max(scores.values()) + 2 * SECOND + 10)  # a catch-up of two each
    assert (first.fired, again.fired, later.fired) == (3, 0, 6), (first, again, later)
    assert not first.quarantined and not later.quarantined
    expected = {key: [fire_job_id(key, scores[key] + i * SECOND) for i in range(3)] for key in "PGN"}

    stream_ids = [f.envelope.id for f in fires(r, queue_name)]
    assert stream_ids == expected["N"]  # only the plain spec's fires entered the stream
    prio = _members(r, k.prioritized)
    assert [_job_id(m) for m, _s in prio] == expected["P"]  # in fire order, all of priority 2
    assert all(2 * PRIO_UNIT < s < 3 * PRIO_UNIT for _m, s in prio)
    assert [_job_id(m) for m in r.lrange(k.group_jobs("tenant-a"), 0, -1)] == expected["G"]
    assert r.zscore(k.groups, "tenant-a") is not None
    assert r.hget(k.controls, "grouped") == b"1" and int(r.hget(k.controls, "prio_seq")) == 3

    ran: list[tuple[str, str]] = []

    async def handler(job: Job) -> None:
        ran.append((job.name, job.id))

    w = Worker(queue_name, handler, redis_url=url, run_scheduler=False, concurrency=1)
    async with running(w):
        await wait_until(lambda: len(ran) >= 9, 60, what="every fire run")
        await asyncio.sleep(0.3)  # nothing more arrives
    assert sorted(i for _n, i in ran) == sorted(sum(expected.values(), []))  # each fire once
    names = [n for n, _i in ran]
    assert names[:3] == ["plain"] * 3  # jobs without a priority first, as added ones
    assert r.zcard(k.prioritized) == 0 and r.llen(k.group_jobs("tenant-a")) == 0


def test_hostile_side_fields_quarantine_only_their_spec(
    q: SyncQueue, r: redis.Redis, url: str, queue_name: str
) -> None:
    """An ext whose priority or group is out of range, of a wrong type, or both at once: that
    spec is moved aside with a reason; the good prioritized spec beside them fires."""
    q.upsert_repeatable_job("good", 1, repeat=RepeatPattern.every(SECOND), key="good", priority=1)
    at = int(r.zscore(q.keys.repeat, "good"))
    hostile = {
        "prio-zero": [1, None, None, 0, None, 0, None],
        "prio-huge": [1, None, None, 0, None, 2**40, None],
        "prio-text": [1, None, None, 0, None, "1", None],
        "prio-nan": [1, None, None, 0, None, float("nan"), None],
        "group-int": [1, None, None, 0, None, None, 7],
        "group-long": [1, None, None, 0, None, None, "g" * (MAX_GROUP_BYTES + 1)],
        "group-empty": [1, None, None, 0, None, None, ""],
        "both": [1, None, None, 0, None, 3, "g"],
    }
    for key, ext in hostile.items():
        spec = StoredSpec(key, "evil", RepeatPattern.every(SECOND), msgpack.packb(1)).encode()
        r.zadd(q.keys.repeat, {key: at})
        r.hset(q.keys.repeat_spec(key), mapping={"spec": spec, "ext": msgpack.packb(ext)})
    result = run_tick(q.driver, queue_name, at + 10)
    reasons = dict(result.quarantined)
    assert set(reasons) == set(hostile), reasons
    assert all("priority/group" in why for why in reasons.values()), reasons
    assert result.fired == 1 and r.zcard(q.keys.prioritized) == 1 and r.xlen(q.keys.stream) == 0
    assert set(r.hkeys(q.keys.repeat_quarantine)) == {k.encode() for k in hostile}


@pytest.mark.parametrize("lane", ["priority", "group"])
def test_side_keys_of_another_type_are_replaced(
    q: SyncQueue, r: redis.Redis, url: str, queue_name: str, lane: str
) -> None:
    """A controls key, prioritized set, groups set or group list of the wrong type (hostile or
    foreign) does not fail the tick: the fire replaces it, as the add scripts do."""
    option: dict[str, Any] = {"priority": 4} if lane == "priority" else {"group": "acme"}
    q.upsert_repeatable_job("x", 1, repeat=RepeatPattern.every(SECOND), key="x", **option)
    at = int(r.zscore(q.keys.repeat, "x"))
    k = q.keys
    r.set(k.controls, "junk")
    r.rpush(k.prioritized, "junk")
    r.sadd(k.groups, "junk")
    r.set(k.group_jobs("acme"), "junk")
    result = run_tick(q.driver, queue_name, at + 10)
    assert result.fired == 1 and not result.quarantined
    if lane == "priority":
        assert r.type(k.prioritized) == b"zset" and r.zcard(k.prioritized) == 1
        assert r.type(k.controls) == b"hash" and r.hget(k.controls, "prio_seq") == b"1"
    else:
        assert r.type(k.group_jobs("acme")) == b"list" and r.llen(k.group_jobs("acme")) == 1
        assert r.type(k.groups) == b"zset" and r.zscore(k.groups, "acme") is not None
        assert r.hget(k.controls, "grouped") == b"1"


@pytest.mark.parametrize("seq", [b"junk", b"-5", b"9223372036854775807", str(2**40).encode()])
def test_a_hostile_priority_sequence_is_rebuilt_by_every_writer(
    q: SyncQueue, r: redis.Redis, url: str, queue_name: str, seq: bytes
) -> None:
    """A ``prio_seq`` HINCRBY rejects, or one outside the room a score leaves it (hostile or
    foreign).  The tick used to fail after it had written the fires of the specs before (the
    next tick fired them again), an add raised, and a Spark chunk failed after its marker was
    set (its retry wrote nothing).  Every writer now rebuilds it from the set, in order."""
    k, every = q.keys, RepeatPattern.every(SECOND)
    first = q.add("first", 1, priority=3)
    q.upsert_repeatable_job("plain", 1, repeat=every, key="N")  # fired before P in one script call
    q.upsert_repeatable_job("urgent", 1, repeat=every, key="P", priority=3)
    at = {key: int(r.zscore(k.repeat, key)) for key in "NP"}
    r.hset(k.controls, "prio_seq", seq)
    result = run_tick(q.driver, queue_name, max(at.values()) + 10)
    assert result.fired == 2 and not result.quarantined, result
    assert run_tick(q.driver, queue_name, max(at.values()) + 10).fired == 0  # each fire once
    assert [f.envelope.id for f in fires(r, queue_name)] == [fire_job_id("N", at["N"])]

    r.hset(k.controls, "prio_seq", seq)
    second = q.add("second", 1, priority=3)
    r.hset(k.controls, "prio_seq", seq)  # the Spark data source's chunk script (priority_col)
    envelope = encode_envelope(Envelope("third", msgpack.packb(1), 0, 0, None))
    chunk = script_call(
        "enqueue_batch_side_once",
        (k.stream, k.controls, k.prioritized, k.groups, k.unique("chunk-0")),
        (60_000, 1_000_000, k.prefix, 3, "", envelope, b"third"),
    )
    assert q.driver.call(chunk) == 1

    members = _members(r, k.prioritized)
    assert [_job_id(m) for m, _s in members] == [first.id, fire_job_id("P", at["P"]), second.id, "third"]
    assert all(3 * PRIO_UNIT < s < 4 * PRIO_UNIT for _m, s in members), members
    assert int(r.hget(k.controls, "prio_seq")) == 4


def test_bad_side_options_on_specs_are_config_errors(q: SyncQueue, url: str, queue_name: str) -> None:
    every = RepeatPattern.every(SECOND)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"priority": 0}, "priority must be between"),
        ({"priority": 1.5}, "priority must be an int"),
        ({"priority": True}, "priority must be an int"),
        ({"group": ""}, "group must be 1 to"),
        ({"group": "g" * (MAX_GROUP_BYTES + 1)}, "group must be 1 to"),
        ({"group": 5}, "group must be a str"),
        ({"priority": 1, "group": "g"}, "not both"),
    ]
    for options, message in bad:
        with pytest.raises(ConfigError, match=message):
            q.upsert_repeatable_job("x", 1, repeat=every, **options)
        with pytest.raises(ConfigError, match=message):
            q.add("x", 1, repeat=every, **options)
        with pytest.raises(ConfigError, match=message):
            q.upsert_repeatable_bulk([{"name": "x", "data": 1, "repeat": every, **options}])
    assert q.list_repeatable()[0] == []
    with SyncShardedQueue(queue_name, 2, redis_url=url) as sharded:
        with pytest.raises(ConfigError, match="sharded queue cannot take a group"):
            sharded.upsert_repeatable_job("x", 1, repeat=every, group="g")
        with pytest.raises(ConfigError, match="sharded queue cannot take a group"):
            sharded.add("x", 1, repeat=every, group="g")
        with pytest.raises(ConfigError, match="sharded queue cannot take a group"):
            sharded.upsert_repeatable_bulk([{"name": "x", "data": 1, "repeat": every, "group": "g"}])
        key = sharded.upsert_repeatable_job("x", 1, repeat=every, priority=3).id  # a priority is fine
        info = sharded.get_repeatable_job(key)
        assert info is not None and info.priority == 3
        assert sharded.remove_repeatable_by_key(key)
