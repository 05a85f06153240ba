"""The scheduler's Lua scripts on real servers (Redis 7.0, Valkey 8.1, Redis 8.2), arguments
built by hand from their headers: compare-and-set, wire spec 11.8-11.10 effects, extensions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airflow_provider_chasqui.core.codec import encode_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.repeat import RepeatPattern, StoredSpec
from airflow_provider_chasqui.core.scripts import SCRIPTS

SPEC = StoredSpec("k1", "rep", RepeatPattern.every(1000), b"\x01").encode()


class Lua:
    def __init__(self, r: redis.Redis, queue: str) -> None:
        self.r = r
        self.k = QueueKeys.for_queue(queue)
        self.corrupt: list[Any] = []

    def __call__(self, name: str, keys: list[Any], argv: list[Any]) -> Any:
        script = SCRIPTS[name]
        assert self.r.script_load(script.body) == script.sha
        return self.r.evalsha(script.sha, len(keys), *keys, *argv)

    def upsert(self, *specs: tuple[int, str, bytes, bytes]) -> Any:
        k = self.k
        return self(
            "upsert_repeatable", [k.repeat, k.repeat_paused], [k.repeat_spec(""), 4, *[x for s in specs for x in s]]
        )

    def schedule(self, now: int, *specs: tuple[Any, ...], maxlen: int = 1000) -> list[int]:
        """specs: (op, key, expected, next, limit, end_before, name, [(at, env), ...]); 'f' takes
        expected, next, name and the one envelope; 'D' only expected; 'Q' the raw bytes as name."""
        k = self.k
        argv: list[Any] = [now, maxlen, k.repeat_spec(""), len(specs), *[s[1] for s in specs]]
        for op, _key, expected, nxt, limit, endb, name, pairs in specs:
            if op == "D":
                argv += [op, expected]
            elif op == "Q":
                argv += [op, expected, "s", name]
            elif op == "f":
                argv += [op, expected, nxt, name, pairs[0][1]]
            else:
                argv += [op, expected, nxt, limit, endb, name, len(pairs)]
                for at, env in pairs:
                    argv += [at, env]
        *reply, self.corrupt = self("schedule_batch", [k.stream, k.delayed, k.repeat, k.repeat_quarantine], argv)
        return reply  # (the specs quarantined at fire time, the reply's last element, in self.corrupt)


@pytest.fixture
def lua(matrix_url: Any, queue_name: str) -> Iterator[Lua]:
    r = redis.Redis.from_url(matrix_url.url)
    try:
        yield Lua(r, queue_name)
    finally:
        r.close()


def test_upsert_writes_the_chasquimq_layout_and_ext(lua: Lua) -> None:
    k = lua.k
    assert lua.upsert((5000, "k1", SPEC, b""), (6000, "k2", SPEC, b"EXT")) == 2
    assert lua.r.zrange(k.repeat, 0, -1, withscores=True) == [(b"k1", 5000), (b"k2", 6000)]
    assert lua.r.hgetall(k.repeat_spec("k1")) == {b"spec": SPEC}
    assert lua.r.hgetall(k.repeat_spec("k2")) == {b"spec": SPEC, b"ext": b"EXT"}
    lua.r.hset(k.repeat_spec("k2"), "fired", 3)
    assert lua.upsert((7000, "k2", SPEC, b"")) == 1  # re-upsert: ext dropped, fired kept
    assert lua.r.hgetall(k.repeat_spec("k2")) == {b"spec": SPEC, b"fired": b"3"}
    assert lua.r.zscore(k.repeat, "k2") == 7000
    lua.r.hset(k.repeat_spec("k2"), "ext", b"EXT")
    # the narrow layout (no ext slots, what a bulk chunk without ext sends) drops a stale ext too
    assert (
        lua(
            "upsert_repeatable", [k.repeat, k.repeat_paused], [k.repeat_spec(""), 3, 8000, "k2", SPEC, 8000, "k3", SPEC]
        )
        == 2
    )
    assert lua.r.hgetall(k.repeat_spec("k2")) == {b"spec": SPEC, b"fired": b"3"}
    assert lua.r.hgetall(k.repeat_spec("k3")) == {b"spec": SPEC}
    assert lua.r.zscore(k.repeat, "k2") == 8000 and lua.r.zscore(k.repeat, "k3") == 8000


def test_pause_resume_remove(lua: Lua) -> None:
    k = lua.k
    lua.upsert((5000, "k1", SPEC, b""))
    keys = [k.repeat, k.repeat_paused, k.repeat_spec("k1")]
    assert lua("pause_repeatable", keys, ["k1"]) == 1
    assert lua("pause_repeatable", keys, ["k1"]) == 2
    assert lua("pause_repeatable", [k.repeat, k.repeat_paused, k.repeat_spec("nope")], ["nope"]) == 0
    assert lua.r.zscore(k.repeat, "k1") is None and lua.r.zscore(k.repeat_paused, "k1") == 5000
    assert lua("resume_repeatable", keys, ["k1", 4999, 9000]) == 0  # not the score we read
    assert lua("resume_repeatable", keys, ["k1", 5000, 9000]) == 1
    assert lua.r.zscore(k.repeat, "k1") == 9000 and lua.r.zscore(k.repeat_paused, "k1") is None
    lua("pause_repeatable", keys, ["k1"])
    lua.upsert((7000, "k1", SPEC, b""))  # an upsert resumes
    assert lua.r.zscore(k.repeat_paused, "k1") is None and lua.r.zscore(k.repeat, "k1") == 7000
    lua("pause_repeatable", keys, ["k1"])
    assert lua("remove_repeatable", [k.repeat, k.repeat_spec("k1"), k.repeat_paused], ["k1"]) == 1
    assert lua("remove_repeatable", [k.repeat, k.repeat_spec("k1"), k.repeat_paused], ["k1"]) == 0
    assert not lua.r.exists(k.repeat_spec("k1"), k.repeat_paused, k.repeat)


def test_fetch_due_returns_scores_and_fields(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "a", SPEC, b""), (2000, "b", SPEC, b"E"), (9000, "c", SPEC, b""))
    lua.r.zadd(k.repeat, {"dangling": 1500})
    reply = lua("fetch_due", [k.repeat], [2000, 10, k.prefix])
    assert reply == [
        b"9000",
        b"2000",
        b"a",
        b"1000",
        SPEC,
        None,
        b"dangling",
        b"1500",
        None,
        None,
        b"b",
        b"2000",
        SPEC,
        b"E",
    ]
    full = lua("fetch_due", [k.repeat], [2000, 2, k.prefix])
    assert full[0] is None and len(full) == 10  # batch full: no look-ahead
    server = lua.r.time()
    now = int(lua("fetch_due", [k.repeat], ["", 10, k.prefix])[1])  # "" = the server's TIME
    assert abs(now - (server[0] * 1000 + server[1] // 1000)) < 5_000


def test_schedule_fires_and_reanchors_under_compare_and_set(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "k1", SPEC, b""))
    status = lua.schedule(1500, ("F", "k1", "1000", 2000, 0, 0, "rep", [(1000, b"ENV1")]))
    assert status == [1, 0, 0, 0, 2]
    assert [(f[b"d"], f[b"n"]) for _i, f in lua.r.xrange(k.stream)] == [(b"ENV1", b"rep")]
    assert lua.r.zscore(k.repeat, "k1") == 2000 and lua.r.hget(k.repeat_spec("k1"), "fired") == b"1"
    # a second scheduler that read the same score loses: nothing fires twice
    assert lua.schedule(1500, ("F", "k1", "1000", 2000, 0, 0, "rep", [(1000, b"ENV1")])) == [0, 0, 0, 1, -1]
    assert lua.r.xlen(k.stream) == 1


def test_schedule_short_entries_fire_under_compare_and_set_next_to_long_ones(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "a", SPEC, b""), (1000, "b", SPEC, b""), (1000, "c", SPEC, b""))
    reply = lua.schedule(
        1500,
        ("f", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")]),
        ("F", "b", "1000", 3000, 0, 0, "", [(1000, b"B")]),
        ("f", "c", "999", 2000, 0, 0, "rep", [(999, b"C")]),
    )  # not the score: lost
    assert reply == [2, 0, 0, 1, 2, 2, -1]
    assert [(f[b"d"], f.get(b"n")) for _i, f in lua.r.xrange(k.stream)] == [(b"A", b"rep"), (b"B", None)]
    assert lua.r.zrange(k.repeat, 0, -1, withscores=True) == [(b"c", 1000), (b"a", 2000), (b"b", 3000)]
    assert lua.r.hget(k.repeat_spec("a"), "fired") == b"1" and lua.r.hget(k.repeat_spec("c"), "fired") is None
    assert lua.schedule(1500, ("f", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")])) == [0, 0, 0, 1, -1]
    assert lua.schedule(1500) == [0, 0, 0, 0]


def test_schedule_limit_end_before_and_no_next_remove_the_spec(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "lim", SPEC, b""), (1000, "end", SPEC, b""), (1000, "zero", SPEC, b""))
    reply = lua.schedule(
        5000,
        ("F", "lim", "1000", 6000, 2, 0, "", [(1000, b"A"), (2000, b"B"), (3000, b"C")]),  # limit hit at 2
        ("F", "end", "1000", 6000, 0, 5500, "x", [(1000, b"D")]),
        ("F", "zero", "1000", 0, 0, 0, "x", [(1000, b"E")]),
    )
    assert reply == [4, 0, 3, 0, 5, 3, 3]
    assert [f[b"d"] for _i, f in lua.r.xrange(k.stream)] == [b"A", b"B", b"D", b"E"]
    assert b"n" not in lua.r.xrange(k.stream)[0][1]  # unnamed spec: no n field
    assert lua.r.zcard(k.repeat) == 0
    assert not lua.r.exists(k.repeat_spec("lim"), k.repeat_spec("end"), k.repeat_spec("zero"))


def test_schedule_deadline_skips_are_counted_and_future_fires_go_to_delayed(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "k1", SPEC, b""))
    reply = lua.schedule(3000, ("F", "k1", "1000", 9000, 0, 0, "rep", [(1000, b""), (2000, b"A"), (4000, b"B")]))
    assert reply == [2, 1, 0, 0, 4]
    assert lua.r.hget(k.repeat_spec("k1"), "skipped") == b"1"
    assert lua.r.hget(k.repeat_spec("k1"), "fired") == b"2"
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(encode_member(b"rep", b"B"), 4000)]


def test_schedule_drops_dangling_entries_and_quarantines_bad_specs(lua: Lua) -> None:
    k = lua.k
    lua.r.zadd(k.repeat, {"gone": 1000, "bad": 1000, "back": 1000})
    lua.r.hset(k.repeat_spec("bad"), "spec", b"\xc1junk")
    lua.r.hset(k.repeat_spec("back"), "spec", SPEC)  # re-upserted after the read: not dropped
    reply = lua.schedule(
        2000,
        ("D", "gone", "1000", 0, 0, 0, "", []),
        ("Q", "bad", "1000", 0, 0, 0, b"\xc1junk", []),
        ("D", "back", "1000", 0, 0, 0, "", []),
    )
    assert reply == [0, 0, 2, 1, 1, 1, -1]
    assert lua.r.zrange(k.repeat, 0, -1) == [b"back"]
    assert lua.r.hgetall(k.repeat_quarantine) == {b"bad": b"\xc1junk"}
    assert not lua.r.exists(k.repeat_spec("bad"))


def test_schedule_quarantines_a_spec_whose_hash_turned_corrupt_and_keeps_the_other_fences(lua: Lua) -> None:
    """A counter HINCRBY rejects, or a key of another type, found at fire time: that spec is
    moved aside before its fire is written; the specs around it fire and are rescored."""
    k = lua.k
    lua.upsert((1000, "a", SPEC, b""), (1000, "bad", SPEC, b""), (1000, "typed", SPEC, b""), (1000, "z", SPEC, b""))
    lua.r.hset(k.repeat_spec("bad"), "fired", "1.5")
    lua.r.delete(k.repeat_spec("typed"))
    lua.r.rpush(k.repeat_spec("typed"), "x")
    reply = lua.schedule(
        1500,
        ("f", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")]),
        ("f", "bad", "1000", 2000, 0, 0, "rep", [(1000, b"B")]),
        ("F", "typed", "1000", 2000, 0, 0, "rep", [(1000, b"T")]),
        ("f", "z", "1000", 2000, 0, 0, "rep", [(1000, b"Z")]),
    )
    assert reply == [2, 0, 2, 0, 2, 1, 1, 2]
    assert lua.corrupt[0::2] == [2, 3]
    assert lua.corrupt[1].startswith(b"the fired counter: ERR hash value is not an integer")
    assert lua.corrupt[3].startswith(b"the fired counter: WRONGTYPE")
    assert [f[b"d"] for _i, f in lua.r.xrange(k.stream)] == [b"A", b"Z"]
    assert lua.r.zrange(k.repeat, 0, -1, withscores=True) == [(b"a", 2000), (b"z", 2000)]
    assert lua.r.hgetall(k.repeat_quarantine) == {b"bad": SPEC, b"typed": b""}


def test_schedule_refuses_queue_keys_of_the_wrong_type_before_any_write(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "a", SPEC, b""))
    lua.r.set(k.stream, "x")
    with pytest.raises(redis.ResponseError, match="is a string, not a stream"):
        lua.schedule(1500, ("f", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")]))
    assert lua.r.zscore(k.repeat, "a") == 1000 and lua.r.hget(k.repeat_spec("a"), "fired") is None


def test_schedule_refuses_a_full_stream_before_any_write(lua: Lua) -> None:
    """A stream whose last id is the largest refuses ``XADD *``: the spec's next fire was written
    before that XADD failed, so the fire was lost.  Now the call is refused first; the spec
    fires once the stream can take entries again."""
    k = lua.k
    lua.upsert((1000, "a", SPEC, b""))
    lua.r.xadd(k.stream, {"junk": "x"}, id="18446744073709551615-18446744073709551615")
    with pytest.raises(redis.ResponseError, match="is full"):
        lua.schedule(1500, ("F", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")]))
    assert lua.r.zscore(k.repeat, "a") == 1000 and lua.r.hget(k.repeat_spec("a"), "fired") is None
    lua.r.delete(k.stream)
    assert lua.schedule(1500, ("F", "a", "1000", 2000, 0, 0, "rep", [(1000, b"A")]))[0] == 1
    assert [f[b"d"] for _i, f in lua.r.xrange(k.stream)] == [b"A"]


def test_fetch_due_reports_corrupt_entries_instead_of_failing(lua: Lua) -> None:
    k = lua.k
    lua.upsert((1000, "ok", SPEC, b""), (1000, "n", SPEC, b""))
    lua.r.zadd(k.repeat, {b"\xff": 1000, "s": 1000})
    lua.r.set(k.repeat_spec("s"), "x")
    lua.r.hset(k.repeat_spec("n"), mapping={"fired": "7", "skipped": "007"})
    reply = lua("fetch_due", [k.repeat], [2000, 10, k.prefix])
    rows = {reply[i]: reply[i + 2] for i in range(2, len(reply), 4)}
    # a key of another type is reported; counters are checked where they are raised (schedule_batch)
    assert rows == {b"ok": SPEC, b"n": SPEC, b"s": [b"the spec key is a string, not a hash"], b"\xff": None}


def test_upsert_replaces_a_key_of_another_type_instead_of_failing_the_batch(lua: Lua) -> None:
    k = lua.k
    lua.r.set(k.repeat_spec("s"), "x")
    lua.r.rpush(k.repeat_spec("l"), "x")
    assert lua.upsert((1000, "a", SPEC, b""), (1000, "s", SPEC, b""), (1000, "l", SPEC, b"EXT")) == 3
    assert lua.r.hgetall(k.repeat_spec("s")) == {b"spec": SPEC}
    assert lua.r.hgetall(k.repeat_spec("l")) == {b"spec": SPEC, b"ext": b"EXT"}
    assert lua.r.zrange(k.repeat, 0, -1) == [b"a", b"l", b"s"]
