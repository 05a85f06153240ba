"""``renew_lease`` and ``reap_consumers`` on the server matrix (Redis 7.0, Valkey 8.1, Redis 8.2):
a renewal resets the idle time of the entries the consumer owns, keeps their delivery count
and never takes back an entry another consumer holds; the reaper never drops a pending entry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from engine_support import wait_until_sync

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scripts import SCRIPTS


@pytest.fixture
def r(matrix_url) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(matrix_url.url) as client:
        yield client


def _run(r: redis.Redis, name: str, keys: list, argv: list):
    script = SCRIPTS[name]
    assert r.script_load(script.body) == script.sha
    return r.evalsha(script.sha, len(keys), *keys, *argv)


def _pel(r: redis.Redis, stream: str) -> dict[bytes, tuple[str, int, int]]:
    rows = r.xpending_range(stream, "default", "-", "+", 100)
    return {
        row["message_id"]: (row["consumer"].decode(), row["time_since_delivered"], row["times_delivered"])
        for row in rows
    }


def test_renew_lease_keeps_what_is_ours_and_reports_the_rest(r: redis.Redis, queue_name: str) -> None:
    stream = QueueKeys.for_queue(queue_name).stream
    r.xgroup_create(stream, "default", id="0", mkstream=True)
    ids = [r.xadd(stream, {"d": b"x", "n": b"j"}) for _ in range(3)]
    r.xreadgroup("default", "c1", {stream: ">"}, count=3)
    r.xclaim(stream, "default", "c1", 0, [ids[0]])  # delivered twice: the count must survive renewals
    wait_until_sync(lambda: min(v[1] for v in _pel(r, stream).values()) >= 300, 10, what="the entries to idle")
    r.xclaim(stream, "default", "c2", 0, [ids[1]])  # taken over by c2
    r.xack(stream, "default", ids[2])  # finished by someone
    lost = _run(r, "renew_lease", [stream], ["default", "c1", *ids])
    assert lost == [ids[1], b"c2", ids[2], b""]
    pel = _pel(r, stream)
    assert pel[ids[0]][0] == "c1" and pel[ids[0]][1] < 300 and pel[ids[0]][2] == 2
    assert pel[ids[1]][0] == "c2" and pel[ids[1]][2] == 2  # not stolen back, count untouched
    assert set(pel) == {ids[0], ids[1]}


def test_reap_consumers_never_drops_a_pending_entry(r: redis.Redis, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    stream, keys = k.stream, [k.stream, k.beats]
    r.xgroup_create(stream, "default", id="0", mkstream=True)
    eid = r.xadd(stream, {"d": b"x", "n": b"j"})
    r.xreadgroup("default", "holder", {stream: ">"}, count=1)
    for name in ("idle-a", "idle-b", "me"):
        r.xgroup_createconsumer(stream, "default", name)
    assert _run(r, "reap_consumers", keys, ["default", 0, "me"]) == [b"me"]
    assert _run(r, "reap_consumers", keys, ["default", 3_600_000, ""]) == []  # none idle for an hour
    assert sorted(_run(r, "reap_consumers", keys, ["default", 0, ""])) == [b"idle-a", b"idle-b"]
    assert [c["name"] for c in r.xinfo_consumers(stream, "default")] == [b"holder"]
    assert _pel(r, stream)[eid][0] == "holder"


def test_reap_consumers_spares_a_consumer_whose_worker_beats(r: redis.Redis, queue_name: str) -> None:
    """Issue 28: an idle consumer whose worker's beat is live is kept (Redis 7.0's ``idle`` says
    nothing of a healthy idle worker); a stale beat does not protect, and is dropped; a beats
    key of another type protects nobody and is left alone; a worker leaving by name goes."""
    k = QueueKeys.for_queue(queue_name)
    stream, keys = k.stream, [k.stream, k.beats]
    r.xgroup_create(stream, "default", id="0", mkstream=True)
    for name in ("alive", "stale", "foreign"):
        r.xgroup_createconsumer(stream, "default", name)
    now = int(r.time()[0]) * 1000
    r.zadd(k.beats, {"alive": now + 60_000, "stale": now - 120_000})
    assert sorted(_run(r, "reap_consumers", keys, ["default", 0, ""])) == [b"foreign", b"stale"]
    assert r.zrange(k.beats, 0, -1) == [b"alive"]  # the stale beat went with the sweep (dead > min idle 0)
    assert _run(r, "reap_consumers", keys, ["default", 0, "alive"]) == [b"alive"]  # leaving: by name
    r.xgroup_createconsumer(stream, "default", "again")
    r.delete(k.beats)
    r.rpush(k.beats, b"junk")
    assert _run(r, "reap_consumers", keys, ["default", 0, ""]) == [b"again"]
    assert r.type(k.beats) == b"list"
