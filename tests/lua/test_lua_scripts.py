"""Each Lua script, run with EVALSHA on real servers, against the effects of wire spec 11.

Runs on the matrix (Redis 7.0, Valkey 8.1, Redis 8.2; fast paths forced off and detected),
because the servers differ where it matters: XACKDEL exists only on 8.2, and each server
ships its own Lua libraries.  Script arguments are built by hand here, from the spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis
from engine_support import kv, wait_until_sync
from wire_vectors import JOB_ID, NAME, V1, V2, V3, V7, V8

from airflow_provider_chasqui.core.codec import Envelope, encode_envelope, encode_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scripts import SCRIPTS

REASON = "handler: Python handler raised: ValueError('boom')"


class Lua:
    """EVALSHA runner for one queue on one server (scripts loaded first, SHAs checked)."""

    def __init__(self, r: redis.Redis, queue: str, xackdel: bool) -> None:
        self.r = r
        self.k = QueueKeys.for_queue(queue)
        self.flag = "1" if xackdel else "0"

    def __call__(self, name: str, keys: list[Any], argv: list[Any]) -> Any:
        script = SCRIPTS[name]
        assert self.r.script_load(script.body) == script.sha
        return self.r.evalsha(script.sha, len(keys), *keys, *argv)

    # small helpers over the queue's keys
    def events(self) -> list[list[tuple[str, bytes]]]:
        return [kv(fields) for _id, fields in self.r.xrange(self.k.events)]

    def stream(self) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        return [(eid, kv(fields)) for eid, fields in self.r.xrange(self.k.stream)]

    def pending_entry(self, fields: dict[str, Any]) -> bytes:
        """XADD an entry and deliver it to consumer c1, so it sits in the PEL."""
        try:
            self.r.xgroup_create(self.k.stream, "default", id="0", mkstream=True)
        except redis.ResponseError as exc:
            assert "BUSYGROUP" in str(exc)
        eid = self.r.xadd(self.k.stream, fields)
        got = self.r.xreadgroup("default", "c1", {self.k.stream: ">"}, count=100)
        assert eid in [e for _s, entries in got for e, _f in entries]
        return eid

    def pending(self) -> int:
        return int(self.r.xpending(self.k.stream, "default")["pending"])


@pytest.fixture
def lua(matrix_url, queue_name: str) -> Iterator[Lua]:
    with redis.Redis.from_url(matrix_url.url) as r:
        xackdel = matrix_url.kind == "redis82" and not matrix_url.force_compat
        yield Lua(r, queue_name, xackdel)


def redis_now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return sec * 1000 + usec // 1000


# ---- 11.1 PROMOTE ------------------------------------------------------------------------------


def promote(lua: Lua, limit: int = 256, events_max: int = 100_000) -> list[int]:
    k = lua.k
    return lua("promote", [k.delayed, k.stream, k.events, k.dlq], [limit, 1_000_000, events_max, k.prefix, 100_000])


def test_promote_v7_gives_d_v2_and_n_send_email(lua: Lua) -> None:
    k = lua.k
    lua.r.zadd(k.delayed, {V7: 1_700_000_060_000})
    lua.r.set(k.didx(JOB_ID), V7)
    lua.r.set(k.dlid(JOB_ID), "1")
    before = redis_now_ms(lua.r)
    promoted, depth, lag, now = promote(lua)
    assert (promoted, depth, lag) == (1, 0, 0)
    assert before <= now <= redis_now_ms(lua.r)
    ((_eid, fields),) = lua.stream()
    assert fields == [("d", V2), ("n", b"send-email")]
    assert lua.r.zcard(k.delayed) == 0
    assert lua.r.exists(k.didx(JOB_ID)) == 0  # side index cleaned up with the promotion
    assert lua.r.get(k.dlid(JOB_ID)) == b"1"  # the dedup marker is left to expire
    assert lua.events() == [[("e", b"waiting"), ("id", JOB_ID.encode()), ("ts", str(now).encode())]]


def test_promote_unnamed_member_writes_no_n(lua: Lua) -> None:
    lua.r.zadd(lua.k.delayed, {encode_member(b"", V2): 1})
    assert promote(lua)[0] == 1
    ((_eid, fields),) = lua.stream()
    assert fields == [("d", V2)]


@pytest.mark.parametrize("id_len", [31, 32, 255, 256, 70_000], ids=["fixstr", "str8", "str8-max", "str16", "str32"])
def test_promote_reads_ids_of_every_msgpack_str_width(lua: Lua, id_len: int) -> None:
    jid = "J" * id_len
    env = encode_envelope(Envelope(jid, V1, 1, 0))
    lua.r.zadd(lua.k.delayed, {encode_member(b"n", env): 1})
    lua.r.set(lua.k.didx(jid), b"x")
    assert promote(lua)[0] == 1
    assert lua.r.exists(lua.k.didx(jid)) == 0
    ((ev,),) = [list(lua.events())]
    assert ev[1] == ("id", jid.encode())


def test_promote_leaves_future_members_and_reports_depth_and_lag(lua: Lua) -> None:
    k = lua.k
    now = redis_now_ms(lua.r)
    old = encode_member(b"a", encode_envelope(Envelope("A", V1, 1, 0)))
    older = encode_member(b"b", encode_envelope(Envelope("B", V1, 1, 0)))
    future = encode_member(b"c", encode_envelope(Envelope("C", V1, 1, 0)))
    lua.r.zadd(k.delayed, {older: now - 5000, old: now - 2000, future: now + 3_600_000})
    promoted, depth, lag, t = promote(lua, limit=1)
    assert (promoted, depth) == (1, 2)
    assert lag >= 2000 and lag == t - (now - 2000)  # the oldest remaining member is `old`
    assert [dict(f)["n"] for _e, f in lua.stream()] == [b"b"]
    promoted, depth, lag, _t = promote(lua)
    assert (promoted, depth, lag) == (1, 1, 0)  # only the future one is left: no lag
    assert lua.r.zrange(k.delayed, 0, -1) == [future]


def test_promote_with_events_off_writes_none(lua: Lua) -> None:
    lua.r.zadd(lua.k.delayed, {V7: 1})
    assert promote(lua, events_max=0)[0] == 1
    assert lua.r.exists(lua.k.events) == 0


def test_promote_tolerates_an_envelope_it_cannot_parse(lua: Lua) -> None:
    """The member still moves (the consumer DLQs it as decode_failed); no waiting event."""
    lua.r.zadd(lua.k.delayed, {encode_member(b"bad", b"\xc1garbage"): 1})
    assert promote(lua)[0] == 1
    ((_eid, fields),) = lua.stream()
    assert fields == [("d", b"\xc1garbage"), ("n", b"bad")]
    assert lua.events() == []


def test_promote_dead_letters_a_member_shorter_than_its_prefix_instead_of_failing(lua: Lua) -> None:
    """A broken member must not stall promotion of everything due after it; it goes to the
    DLQ with every byte it had."""
    lua.r.zadd(lua.k.delayed, {b"\x01\x02": 1, V7: 2})
    assert promote(lua)[0] == 2
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")]]
    ((_id, fields),) = lua.r.xrange(lua.k.dlq)
    assert kv(fields) == [
        ("d", b"\x01\x02"),
        ("source_id", b""),
        ("reason", b"decode_failed"),
        ("detail", b"delayed member: member of 2 bytes is shorter than its 4-byte name prefix"),
    ]
    assert lua.r.zcard(lua.k.delayed) == 0


@pytest.mark.parametrize("prefix", [b"\x09\x00\x00\x00", b"\xff\xff\xff\xff"])
def test_promote_dead_letters_a_member_whose_name_length_overruns_with_all_its_bytes(lua: Lua, prefix: bytes) -> None:
    """Issue #12: the old script XADDed ``d ""`` and the bytes as ``n``; the worker's
    decode_failed then dropped the name: every byte was lost."""
    member = prefix + b"short" + b"\x00\xc1"
    lua.r.zadd(lua.k.delayed, {member: 1, V7: 2})
    assert promote(lua)[0] == 2
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")]]
    ((_id, fields),) = lua.r.xrange(lua.k.dlq)
    n = int.from_bytes(prefix, "little")
    assert kv(fields) == [
        ("d", member),
        ("source_id", b""),
        ("reason", b"decode_failed"),
        ("detail", f"delayed member: name length {n} runs past the member (11 bytes)".encode()),
    ]
    assert [dict(e)["e"] for e in lua.events()] == [b"waiting"]  # the good member only


def test_two_promoters_cannot_promote_a_member_twice(lua: Lua) -> None:
    lua.r.zadd(lua.k.delayed, {V7: 1})
    assert promote(lua)[0] == 1
    assert promote(lua)[0] == 0
    assert lua.r.xlen(lua.k.stream) == 1


# ---- 11.2 RETRY (the worker's: a `fail_batch` row of kind 'r') --------------------------------


def retry(lua: Lua, eid: bytes, run_at: int, member: bytes, name: str, events_max: int = 100_000) -> int:
    """One retry as the worker writes it: a one-row ``fail_batch`` call; its reply for the row."""
    k = lua.k
    argv = ["default", lua.flag, events_max, 100_000, 0, k.prefix, 1_700_000_000_200, 10_000]
    argv += ["r", eid, JOB_ID, name, 1, REASON, 511, run_at, member, 2, 137, ""]
    (reply,) = lua("fail_batch", [k.stream, k.delayed, k.dlq, k.events], argv)
    return int(reply)


def test_retry_gate_returns_1_then_0(lua: Lua) -> None:
    k = lua.k
    eid = lua.pending_entry({"d": V2, "n": NAME})
    run_at = 1_700_000_000_337
    assert retry(lua, eid, run_at, V8, NAME) == 1
    assert lua.r.zscore(k.delayed, V8) == run_at
    assert lua.r.xlen(k.stream) == 0 and lua.pending() == 0  # acked and deleted
    expected_events = [
        [
            ("e", b"failed"),
            ("id", JOB_ID.encode()),
            ("ts", b"1700000000200"),
            ("n", b"send-email"),
            ("attempt", b"1"),
            ("reason", REASON.encode()),
            ("duration_us", b"511"),
        ],
        [
            ("e", b"retry-scheduled"),
            ("id", JOB_ID.encode()),
            ("ts", b"1700000000200"),
            ("n", b"send-email"),
            ("attempt", b"2"),
            ("backoff_ms", b"137"),
        ],
    ]
    assert lua.events() == expected_events
    assert lua.r.xlen(k.dlq) == 0 and lua.r.exists(k.failure(JOB_ID)) == 0  # a retry keeps no record
    # a repeated call (e.g. a client retry after a lost reply) schedules nothing twice
    assert retry(lua, eid, run_at + 5, V8, NAME) == 0
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(V8, run_at)]
    assert lua.events() == expected_events


def test_retry_unnamed_job_has_no_n_in_events(lua: Lua) -> None:
    eid = lua.pending_entry({"d": V2})
    member = encode_member(b"", encode_envelope(Envelope(JOB_ID, V1, 1_700_000_000_000, 1)))
    assert retry(lua, eid, 5, member, "") == 1
    assert [dict(e).get("n") for e in lua.events()] == [None, None]
    assert lua.r.zrange(lua.k.delayed, 0, -1) == [member]


def test_retry_of_an_entry_nobody_holds_does_nothing(lua: Lua) -> None:
    k = lua.k
    lua.pending_entry({"d": V2})
    assert retry(lua, b"1-1", 5, V8, NAME) == 0
    assert lua.r.zcard(k.delayed) == 0 and lua.events() == [] and lua.r.xlen(k.stream) == 1


# ---- DLQ relocation (7.1, as one script) ----------------------------------------------------------


def dead_letter_args(lua: Lua, eid: bytes, **over: Any) -> list[Any]:
    a = {
        "payload": V3,
        "name": NAME,
        "reason": "retries_exhausted",
        "detail": "",
        "job_id": JOB_ID,
        "attempt": 3,
        "failed": REASON,
        "duration_us": 9,
        "failure_ttl": 0,
    }
    a.update(over)
    return [
        "default",
        eid,
        lua.flag,
        100_000,
        100_000,
        1_700_000_005_100,
        a["payload"],
        a["name"],
        a["reason"],
        a["detail"],
        a["job_id"],
        a["attempt"],
        a["failed"],
        a["duration_us"],
        a["failure_ttl"],
        lua.k.prefix,
        a.get("failures_max", 10_000),
        a.get("dlq_name", b""),
    ]


def test_dead_letter_after_the_last_run(lua: Lua) -> None:
    k = lua.k
    eid = lua.pending_entry({"d": V3, "n": NAME})
    keys = [k.stream, k.dlq, k.events]
    assert lua("dead_letter", keys, dead_letter_args(lua, eid)) == 1
    assert lua.r.xlen(k.stream) == 0 and lua.pending() == 0
    ((_id, fields),) = lua.r.xrange(k.dlq)
    assert kv(fields) == [("d", V3), ("n", b"send-email"), ("source_id", eid), ("reason", b"retries_exhausted")]
    assert lua.events() == [
        [
            ("e", b"failed"),
            ("id", JOB_ID.encode()),
            ("ts", b"1700000005100"),
            ("n", b"send-email"),
            ("attempt", b"3"),
            ("reason", REASON.encode()),
            ("duration_us", b"9"),
        ],
        [
            ("e", b"dlq"),
            ("id", JOB_ID.encode()),
            ("ts", b"1700000005100"),
            ("n", b"send-email"),
            ("attempt", b"3"),
            ("reason", b"retries_exhausted"),
        ],
    ]
    # exactly once: the entry is no longer pending, so a repeat writes nothing
    assert lua("dead_letter", keys, dead_letter_args(lua, eid)) == 0
    assert lua.r.xlen(k.dlq) == 1 and len(lua.events()) == 2


def test_dead_letter_reader_side_malformed(lua: Lua) -> None:
    k = lua.k
    eid = lua.pending_entry({"x": "no d"})
    args = dead_letter_args(
        lua,
        eid,
        payload=b"",
        name="",
        reason="malformed",
        detail="missing or non-bytes payload field",
        job_id="",
        attempt=0,
        failed="",
    )
    assert lua("dead_letter", [k.stream, k.dlq, k.events], args) == 1
    ((_id, fields),) = lua.r.xrange(k.dlq)
    assert kv(fields) == [
        ("d", b""),
        ("source_id", eid),
        ("reason", b"malformed"),
        ("detail", b"missing or non-bytes payload field"),
    ]
    assert lua.events() == [
        [("e", b"dlq"), ("id", b""), ("ts", b"1700000005100"), ("attempt", b"0"), ("reason", b"malformed")]
    ]


def test_dead_letter_failure_record(lua: Lua) -> None:
    k = lua.k
    eid = lua.pending_entry({"d": V2})
    args = dead_letter_args(lua, eid, payload=V2, name="", reason="unrecoverable", attempt=1, failure_ttl=60_000)
    assert lua("dead_letter", [k.stream, k.dlq, k.events], args) == 1
    # no DLQ detail: the record keeps the handler's error instead (our key, not on the wire)
    assert msgpack.unpackb(lua.r.get(k.failure(JOB_ID)), raw=False) == ["unrecoverable", REASON, 1_700_000_005_100]
    assert 0 < lua.r.pttl(k.failure(JOB_ID)) <= 60_000
    eid = lua.pending_entry({"d": V2})
    args = dead_letter_args(
        lua, eid, payload=V2, reason="malformed", detail="fields not an array", failed="", failure_ttl=60_000
    )
    assert lua("dead_letter", [k.stream, k.dlq, k.events], args) == 1
    assert msgpack.unpackb(lua.r.get(k.failure(JOB_ID)), raw=False)[:2] == ["malformed", "fields not an array"]


def test_dead_letter_keeps_the_original_name_bytes_and_caps_failure_records(lua: Lua) -> None:
    k = lua.k
    raw_name = b"\xff" + b"x" * 300  # not UTF-8, over the name limit: the events name nothing
    for i in range(5):
        eid = lua.pending_entry({"d": b"\xc1", "n": raw_name})
        args = dead_letter_args(
            lua,
            eid,
            payload=b"\xc1",
            name="",
            reason="decode_failed",
            detail="bad",
            failed="",
            job_id=f"J{i}",
            failure_ttl=60_000,
            failures_max=3,
            dlq_name=raw_name,
        )
        assert lua("dead_letter", [k.stream, k.dlq, k.events], args) == 1
    assert all(kv(f)[:2] == [("d", b"\xc1"), ("n", raw_name)] for _e, f in lua.r.xrange(k.dlq))
    assert all(b"n" not in dict(e) for e in lua.events())
    assert [lua.r.exists(k.failure(f"J{i}")) for i in range(5)] == [0, 0, 1, 1, 1]  # the 3 newest
    assert lua.r.zcard(k.failures) == 3 and 0 < lua.r.pttl(k.failures) <= 60_000


# ---- 11.3 REPLAY_DLQ ---------------------------------------------------------------------------


def test_replay_moves_each_entry_once(lua: Lua) -> None:
    k = lua.k
    named = lua.r.xadd(k.dlq, {"d": V3, "n": NAME, "source_id": "1-0", "reason": "retries_exhausted"})
    unnamed = lua.r.xadd(k.dlq, {"d": V3, "source_id": "1-1", "reason": "unrecoverable"})
    argv = [1_000_000, named, V2, NAME, unnamed, V2, ""]
    assert lua("replay_dlq", [k.dlq, k.stream], argv) == 2
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")], [("d", V2)]]
    assert lua.r.xlen(k.dlq) == 0
    assert lua("replay_dlq", [k.dlq, k.stream], argv) == 0  # concurrent/repeated replays cannot duplicate
    assert lua.r.xlen(k.stream) == 2


def test_spoiled_keys_never_make_a_move_lose_or_repeat_a_job(lua: Lua) -> None:
    """The scripts that take a job from one key and write it to another (promote, replay_dlq,
    dead_letter, take_prioritized, take_grouped) check the key they write first.  Before, a promoter facing
    an events key of another type wrote the first due job to the stream and failed before
    removing it, so it promoted that job again at every tick; a DLQ replay into a spoiled
    stream, or a dead-lettering into a spoiled DLQ, deleted the job and lost it."""
    k, r = lua.k, lua.r
    promote_keys = [k.delayed, k.stream, k.events, k.dlq]
    promote_argv = [256, 1_000_000, 100_000, k.prefix, 1_000]
    r.zadd(k.delayed, {encode_member(NAME.encode(), V2): 1, encode_member(b"", V3): 2})

    # an events key of another type: the events are skipped, each job promoted once
    r.set(k.events, "junk")
    assert lua("promote", promote_keys, promote_argv)[0] == 2
    assert lua("promote", promote_keys, promote_argv)[0] == 0
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")], [("d", V3)]]
    assert r.get(k.events) == b"junk"

    # a stream of another type: refused before any write, the members stay due
    r.delete(k.stream)
    r.zadd(k.delayed, {encode_member(b"", V2): 3, b"\x01": 4})  # the second goes to the DLQ
    r.set(k.stream, "junk")
    with pytest.raises(redis.ResponseError, match=f"promote: {re.escape(k.stream)} is a string"):
        lua("promote", promote_keys, promote_argv)
    assert r.zcard(k.delayed) == 2
    r.delete(k.stream)
    # a DLQ of another type: the member bound for it stays due, the other one is promoted (a
    # spoiled DLQ used to stop every promotion)
    r.set(k.dlq, "junk")
    assert lua("promote", promote_keys, promote_argv)[0] == 1
    assert r.xlen(k.stream) == 1 and r.zrange(k.delayed, 0, -1) == [b"\x01"] and r.get(k.dlq) == b"junk"
    r.delete(k.dlq)
    assert lua("promote", promote_keys, promote_argv)[0] == 1
    assert r.xlen(k.stream) == 1 and r.xlen(k.dlq) == 1 and r.zcard(k.delayed) == 0

    # replaying into a stream of another type: the DLQ entry stays
    r.delete(k.stream)
    ((dlq_id, _f),) = r.xrange(k.dlq)
    r.set(k.stream, "junk")
    with pytest.raises(redis.ResponseError, match=f"replay_dlq: {re.escape(k.stream)} is a string"):
        lua("replay_dlq", [k.dlq, k.stream], [1_000_000, dlq_id, V2, ""])
    assert r.xlen(k.dlq) == 1
    r.delete(k.stream, k.dlq)

    # dead-lettering into a DLQ of another type: nothing acked, the entry stays pending
    eid = lua.pending_entry({"d": V3, "n": NAME})
    dl_keys = [k.stream, k.dlq, k.events]
    r.set(k.dlq, "junk")
    with pytest.raises(redis.ResponseError, match=f"dead_letter: {re.escape(k.dlq)} is a string"):
        lua("dead_letter", dl_keys, dead_letter_args(lua, eid, failure_ttl=60_000))
    assert lua.pending() == 1 and r.xlen(k.stream) == 1
    r.delete(k.dlq)
    r.set(f"{k.prefix}:failures", "junk")  # a failures index of another type is skipped, like the events
    assert lua("dead_letter", dl_keys, dead_letter_args(lua, eid, failure_ttl=60_000)) == 1
    assert lua.pending() == 0 and r.xlen(k.dlq) == 1 and r.exists(f"{k.prefix}:failure:{JOB_ID}")

    # moving prioritized jobs into a stream of another type: nothing popped
    r.delete(k.stream)
    r.zadd(k.prioritized, {encode_member(NAME.encode(), V2): 1})
    r.set(k.stream, "junk")
    assert lua("take_prioritized", [k.prioritized, k.stream], [10, 1_000_000]) == 0
    assert r.zcard(k.prioritized) == 1
    r.delete(k.stream)
    assert lua("take_prioritized", [k.prioritized, k.stream], [10, 1_000_000]) == 1
    assert r.zcard(k.prioritized) == 0 and r.xlen(k.stream) == 1

    # and a group's jobs: nothing popped from its list
    r.delete(k.stream)
    r.rpush(k.group_jobs("acme"), encode_member(NAME.encode(), V2))
    r.zadd(k.groups, {"acme": 1})
    grouped = ([k.groups, k.stream, k.group_limits], [10, 1_000_000, 30_000, k.prefix])
    r.set(k.stream, "junk")
    assert lua("take_grouped", *grouped) == 0
    assert r.llen(k.group_jobs("acme")) == 1
    r.delete(k.stream)
    assert lua("take_grouped", *grouped) == 1
    assert r.llen(k.group_jobs("acme")) == 0 and r.xlen(k.stream) == 1


# ---- 11.4 / 11.5 locks -----------------------------------------------------------------------------


def test_locks_acquire_renew_and_compare_and_delete(lua: Lua) -> None:
    lock = lua.k.promoter_lock
    assert lua("acquire_lock", [lock], ["c-a", 5]) == 1
    assert lua.r.get(lock) == b"c-a" and 0 < lua.r.ttl(lock) <= 5
    assert lua("acquire_lock", [lock], ["c-b", 5]) == 0  # someone else leads
    lua.r.expire(lock, 2)
    assert lua("acquire_lock", [lock], ["c-a", 5]) == 1  # renewal restores the TTL
    assert lua.r.ttl(lock) > 2
    assert lua("release_lock", [lock], ["c-b"]) == 0
    assert lua.r.get(lock) == b"c-a"
    assert lua("release_lock", [lock], ["c-a"]) == 1
    assert lua.r.exists(lock) == 0
    assert lua("acquire_lock", [lock], ["c-b", 5]) == 1


def test_a_spoiled_lock_never_keeps_every_leader_out(lua: Lua) -> None:
    """A lock key of another type made every acquire fail (GET on a list), and a foreign holder
    that set no expiry kept the lock for ever: no promoter promoted, no scheduler fired.  Now
    the first is replaced and the second given the lock's TTL (a holder that renews keeps it)."""
    r, lock = lua.r, lua.k.promoter_lock
    r.rpush(lock, "junk")
    assert lua("release_lock", [lock], ["c-a"]) == 0 and r.type(lock) == b"list"
    assert lua("acquire_lock", [lock], ["c-a", 5]) == 1
    assert r.get(lock) == b"c-a" and 0 < r.ttl(lock) <= 5
    r.set(lock, "foreign")  # no expiry
    assert lua("acquire_lock", [lock], ["c-a", 1]) == 0
    assert r.get(lock) == b"foreign" and 0 < r.pttl(lock) <= 1000
    wait_until_sync(lambda: not r.exists(lock), 10, what="the foreign holder's lapse")
    assert lua("acquire_lock", [lock], ["c-a", 5]) == 1 and r.get(lock) == b"c-a"


def test_scheduler_lock_is_independent(lua: Lua) -> None:
    assert lua("acquire_lock", [lua.k.promoter_lock], ["c-a", 5]) == 1
    assert lua("acquire_lock", [lua.k.scheduler_lock], ["s-b", 5]) == 1


# ---- 11.6 / 11.7 idempotent schedule and cancel ------------------------------------------------------


def schedule(lua: Lua, member: bytes = V7, run_at: int = 1_700_000_060_000) -> int:
    k = lua.k
    return lua("schedule_delayed_idempotent", [k.dlid(JOB_ID), k.delayed, k.didx(JOB_ID)], [3660, run_at, member])


def cancel(lua: Lua) -> int:
    k = lua.k
    return lua("cancel_delayed", [k.delayed, k.didx(JOB_ID), k.dlid(JOB_ID)], [])


def test_idempotent_schedule_1_then_0(lua: Lua) -> None:
    k = lua.k
    assert schedule(lua) == 1
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(V7, 1_700_000_060_000)]
    assert lua.r.get(k.dlid(JOB_ID)) == b"1" and lua.r.get(k.didx(JOB_ID)) == V7
    assert 3650 < lua.r.ttl(k.dlid(JOB_ID)) <= 3660 and 3650 < lua.r.ttl(k.didx(JOB_ID)) <= 3660
    other = encode_member(b"other", V2)
    assert schedule(lua, other, 5) == 0  # duplicate suppressed, nothing changes
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(V7, 1_700_000_060_000)]


def test_cancel_then_schedule_again(lua: Lua) -> None:
    k = lua.k
    assert schedule(lua) == 1
    assert cancel(lua) == 1
    assert lua.r.zcard(k.delayed) == 0
    assert lua.r.exists(k.didx(JOB_ID), k.dlid(JOB_ID)) == 0
    assert cancel(lua) == 0
    assert schedule(lua) == 1  # the same id may be scheduled again


def test_cancel_after_promotion_returns_0_and_leaves_the_marker(lua: Lua) -> None:
    k = lua.k
    assert schedule(lua) == 1
    lua.r.zrem(k.delayed, V7)  # promoted (or otherwise gone) in between
    assert cancel(lua) == 0
    assert lua.r.get(k.dlid(JOB_ID)) == b"1"  # left to expire: a late duplicate is still suppressed


def test_cancel_of_an_unknown_id(lua: Lua) -> None:
    assert cancel(lua) == 0


# ---- our batch scripts ----------------------------------------------------------------------------


def test_complete_batch_acks_records_results_and_events(lua: Lua) -> None:
    k = lua.k
    e1 = lua.pending_entry({"d": V2, "n": NAME})
    e2 = lua.pending_entry({"d": V2})
    argv = [
        "default",
        lua.flag,
        100_000,
        60_000,
        k.prefix,
        1_700_000_000_106,
        10_000,
        e1,
        "J1",
        NAME,
        1,
        842,
        msgpack.packb({"ok": 1}),
        e2,
        "J2",
        "",
        2,
        7,
        "",
    ]
    assert lua("complete_batch", [k.stream, k.events], argv) == 2
    assert lua.r.xlen(k.stream) == 0 and lua.pending() == 0
    assert msgpack.unpackb(lua.r.get(k.result("J1"))) == {"ok": 1}
    assert 0 < lua.r.pttl(k.result("J1")) <= 60_000
    assert lua.r.exists(k.result("J2")) == 0  # "" = nothing to store
    expected = [
        [
            ("e", b"completed"),
            ("id", b"J1"),
            ("ts", b"1700000000106"),
            ("n", b"send-email"),
            ("attempt", b"1"),
            ("duration_us", b"842"),
        ],
        [("e", b"completed"), ("id", b"J2"), ("ts", b"1700000000106"), ("attempt", b"2"), ("duration_us", b"7")],
    ]
    assert lua.events() == expected
    assert lua("complete_batch", [k.stream, k.events], argv) == 0  # already acked: no second event
    assert lua.events() == expected


def test_complete_batch_with_events_and_results_off(lua: Lua) -> None:
    k = lua.k
    e1 = lua.pending_entry({"d": V2})
    argv = ["default", lua.flag, 0, 0, k.prefix, 1, 10_000, e1, "J1", "", 1, 5, b"\x01"]
    assert lua("complete_batch", [k.stream, k.events], argv) == 1
    assert lua.r.exists(k.events, k.result("J1"), k.results) == 0


def test_complete_batch_keeps_the_newest_results_up_to_the_cap(lua: Lua) -> None:
    """Results are bounded by count as well as TTL: the index keeps the newest ``max``, the
    oldest result keys are deleted in the same call, at most (stored + 64) per call."""
    k, index = lua.k, lua.k.results
    for batch in range(6):
        eids = [lua.pending_entry({"d": V2}) for _ in range(10)]
        argv: list[Any] = ["default", lua.flag, 0, 60_000, k.prefix, 1_000 + batch, 25]
        for i, eid in enumerate(eids):
            argv += [eid, f"J{batch}-{i}", "", 1, 1, b"r"]
        assert lua("complete_batch", [k.stream, k.events], argv) == 10
        assert lua.r.zcard(index) == min(25, 10 * (batch + 1))
    kept = [f"J{b}-{i}" for b in range(6) for i in range(10) if lua.r.exists(k.result(f"J{b}-{i}"))]
    assert kept == [f"J3-{i}" for i in range(5, 10)] + [f"J{b}-{i}" for b in (4, 5) for i in range(10)]
    assert sorted(m.decode() for m in lua.r.zrange(index, 0, -1)) == sorted(kept)
    assert 0 < lua.r.pttl(index) <= 60_000
    # a lowered cap: the next call trims down to it (at most stored + 64 keys per call)
    eids = [lua.pending_entry({"d": V2}) for _ in range(2)]
    argv = [
        "default",
        lua.flag,
        0,
        60_000,
        k.prefix,
        2_000,
        1,
        eids[0],
        "L0",
        "",
        1,
        1,
        b"r",
        eids[1],
        "L1",
        "",
        1,
        1,
        b"r",
    ]
    assert lua("complete_batch", [k.stream, k.events], argv) == 2
    assert lua.r.zcard(index) == 1 and lua.r.exists(k.result("L1")) == 1


def test_enqueue_batch_and_delay_batch(lua: Lua) -> None:
    k = lua.k
    assert lua("enqueue_batch", [k.stream], [1_000_000, V2, NAME, V3, ""]) == 2
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")], [("d", V3)]]
    assert lua("delay_batch", [k.delayed], [10, V7, 20, V8]) == 2
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(V7, 10), (V8, 20)]


MARKED_WRITES = [  # (script, the key spoiled): every script that sets a marker before it writes that key
    ("enqueue_batch_once", "stream"),
    ("enqueue_batch_once", "delayed"),
    ("enqueue_batch_side_once", "stream"),
    ("enqueue_batch_unique", "stream"),
    ("enqueue_batch_unique", "delayed"),
    ("add_unique", "stream"),
    ("add_unique", "delayed"),
    ("add_dedup", "stream"),
    ("add_dedup", "delayed"),
    ("schedule_delayed_idempotent", "delayed"),
]


@pytest.mark.parametrize(("script", "spoiled"), MARKED_WRITES)
def test_a_write_behind_a_marker_refuses_a_key_of_another_type_before_the_marker(
    lua: Lua, script: str, spoiled: str
) -> None:
    """A script that sets a marker (a Spark chunk's, a unique job's, a dedup or idempotent
    delayed add's) and then found the stream or the delayed set of another type failed after
    the marker was set: a retry found the marker and wrote nothing, so the jobs were lost while
    the caller was told they were there.  Now the key is checked first: an error naming it and
    no marker; once the key is fixed, the same call adds the jobs."""
    k = lua.k
    member = encode_member(NAME.encode(), V2)
    marker = k.unique("m-1")
    keys, argv = {
        "enqueue_batch_once": ([k.stream, k.delayed, marker], [60_000, 1_000_000, 0, V2, NAME, 5, member, ""]),
        "enqueue_batch_side_once": (
            [k.stream, k.controls, k.prioritized, k.groups, marker],
            [60_000, 1_000_000, k.prefix, 0, "", V2, NAME],
        ),
        "enqueue_batch_unique": (
            [k.stream, k.delayed, marker, k.unique("m-2")],
            [60_000, 1_000_000, "m-1", 0, V2, NAME, "m-2", 5, member, ""],
        ),
        # (the one-job adds check the key they write: the stream now, the delayed set later)
        "add_unique": (
            [marker, k.stream, k.delayed],
            [60_000, "m-1", 0 if spoiled == "stream" else 5, 1_000_000, V2, NAME, member],
        ),
        "add_dedup": (
            [marker, k.stream, k.delayed, k.events],
            ["throttle" if spoiled == "stream" else "debounce", 60_000, "m-1", 1_000_000, V2, NAME, member, 0, "d"],
        ),
        "schedule_delayed_idempotent": ([marker, k.delayed, k.unique("m-2")], [3600, 5, member]),
    }[script]
    key = k.stream if spoiled == "stream" else k.delayed
    lua.r.set(key, "junk")
    with pytest.raises(redis.ResponseError, match=f"{script}: {re.escape(key)} is a string, not a"):
        lua(script, keys, argv)
    assert not lua.r.exists(marker), "the marker was left behind"
    lua.r.delete(key)
    lua(script, keys, argv)
    assert lua.r.exists(marker)
    written = lua.r.xlen(k.stream) + lua.r.zcard(k.delayed)
    assert written >= 1


def test_a_one_job_add_goes_through_a_spoiled_key_it_does_not_write(lua: Lua) -> None:
    """An immediate unique add or a throttled one writes the stream only, a delayed unique add or
    a debounced one the delayed set only: a spoiled other key used to refuse them all."""
    k, r = lua.k, lua.r
    member = encode_member(NAME.encode(), V2)
    r.set(k.delayed, "junk")
    assert (
        lua("add_unique", [k.unique("u1"), k.stream, k.delayed], [60_000, "J1", 0, 1_000_000, V2, NAME, member])[0] == 1
    )
    dedup = [k.unique("u2"), k.stream, k.delayed, k.events]
    assert lua("add_dedup", dedup, ["throttle", 60_000, "J2", 1_000_000, V2, NAME, member, 0, "d"])[0] == 1
    assert r.xlen(k.stream) == 2 and r.get(k.delayed) == b"junk"
    r.delete(k.delayed, k.stream)
    r.set(k.stream, "junk")
    assert (
        lua("add_unique", [k.unique("u3"), k.stream, k.delayed], [60_000, "J3", 5, 1_000_000, V2, NAME, member])[0] == 1
    )
    dedup = [k.unique("u4"), k.stream, k.delayed, k.events]
    assert lua("add_dedup", dedup, ["debounce", 60_000, "J4", 1_000_000, V2, NAME, member, 0, "d"])[0] == 1
    assert r.zcard(k.delayed) == 1 and r.get(k.stream) == b"junk"  # (one member: the same bytes twice)


def test_emit_events_writes_each_event_in_order(lua: Lua) -> None:
    k = lua.k
    argv = [100_000, 2, "e", "drained", "id", "", 3, "e", "active", "id", "J", "attempt", "1"]
    assert lua("emit_events", [k.events], argv) == 2
    assert lua.events() == [[("e", b"drained"), ("id", b"")], [("e", b"active"), ("id", b"J"), ("attempt", b"1")]]


def test_emit_events_compact_form_writes_the_spec_s_active_events(lua: Lua) -> None:
    """The worker's ``active`` events (spec V14): ``e id ts [n] attempt``, ``n`` only when named."""
    k = lua.k
    argv = [100_000, 0, "active", 1_700_000_000_105, JOB_ID, NAME, 1, "J2", "", 3]
    assert lua("emit_events", [k.events], argv) == 2
    ts = ("ts", b"1700000000105")
    assert lua.events() == [
        [("e", b"active"), ("id", JOB_ID.encode()), ts, ("n", NAME.encode()), ("attempt", b"1")],
        [("e", b"active"), ("id", b"J2"), ts, ("attempt", b"3")],
    ]


def test_add_unique_marker(lua: Lua) -> None:
    k = lua.k
    keys = [k.unique("u1"), k.stream, k.delayed]
    assert lua("add_unique", keys, [60_000, "J1", 0, 1_000_000, V2, NAME, b""]) == [1, b"J1"]
    assert lua("add_unique", keys, [60_000, "J2", 0, 1_000_000, V3, NAME, b""]) == [0, b"J1"]
    assert [f for _e, f in lua.stream()] == [[("d", V2), ("n", b"send-email")]]
    assert 0 < lua.r.pttl(k.unique("u1")) <= 60_000
    delayed_keys = [k.unique("u2"), k.stream, k.delayed]
    assert lua("add_unique", delayed_keys, [60_000, "J3", 99, 1_000_000, V2, "", V7]) == [1, b"J3"]
    assert lua.r.zrange(k.delayed, 0, -1, withscores=True) == [(V7, 99)]


def test_every_engine_script_has_a_test() -> None:
    """The engine's scripts (the scheduler's are tested with the scheduler)."""
    tested = {
        "promote",
        "dead_letter",
        "replay_dlq",
        "acquire_lock",
        "release_lock",
        "schedule_delayed_idempotent",
        "cancel_delayed",
        "complete_batch",
        "enqueue_batch",
        "delay_batch",
        "emit_events",
        "add_unique",
        "fail_batch",
    }
    assert tested <= set(SCRIPTS)


# ---- fail_batch: the worker's failures, a batch per call --------------------------------------------

NOW = 1_700_000_009_000


def _fail_cases(lua: Lua) -> list[dict[str, Any]]:
    """One of each: retries with and without a name, handler DLQ moves (exhausted, unrecoverable,
    unnamed), a gate rejection (no handler ran), and entries no longer pending (retry and DLQ)."""
    unnamed_member = encode_member(b"", encode_envelope(Envelope(JOB_ID, V1, 1_700_000_000_000, 1)))
    return [
        {
            "kind": "r",
            "fields": {"d": V2, "n": NAME},
            "job": JOB_ID,
            "name": NAME,
            "attempt": 1,
            "failed": REASON,
            "dur": 511,
            "run_at": NOW + 137,
            "member": V8,
            "next": 2,
            "backoff": 137,
        },
        {
            "kind": "r",
            "fields": {"d": V2},
            "job": "J-unnamed",
            "name": "",
            "attempt": 1,
            "failed": REASON,
            "dur": 7,
            "run_at": NOW + 50,
            "member": unnamed_member,
            "next": 2,
            "backoff": 50,
        },
        {
            "kind": "r",
            "fields": {"d": V2, "n": NAME},
            "job": "J-gone-r",
            "name": NAME,
            "attempt": 1,
            "failed": REASON,
            "dur": 3,
            "run_at": NOW + 9,
            "member": b"gone-member",
            "next": 2,
            "backoff": 9,
            "gone": True,
        },
        {
            "kind": "d",
            "fields": {"d": V3, "n": NAME},
            "job": "J-exhausted",
            "name": NAME,
            "attempt": 3,
            "failed": REASON,
            "dur": 9,
            "payload": V3,
            "reason": "retries_exhausted",
            "detail": "",
            "tb": TB,
        },
        {
            "kind": "d",
            "fields": {"d": V2},
            "job": "J-unrec",
            "name": "",
            "attempt": 1,
            "failed": REASON,
            "dur": 4,
            "payload": V2,
            "reason": "unrecoverable",
            "detail": "",
        },
        {
            "kind": "d",
            "fields": {"x": "no d"},
            "job": "",
            "name": "",
            "attempt": 0,
            "failed": "",
            "dur": 0,
            "payload": b"",
            "reason": "malformed",
            "detail": "missing or non-bytes payload field",
        },
        {
            "kind": "d",
            "fields": {"d": V3, "n": NAME},
            "job": "J-gone-d",
            "name": NAME,
            "attempt": 2,
            "failed": REASON,
            "dur": 1,
            "payload": V3,
            "reason": "retries_exhausted",
            "detail": "",
            "gone": True,
        },
    ]


TB = (
    'Traceback (most recent call last):\n  File "h.py", line 3, in send\n'
    '    raise ValueError("boom")\nValueError: boom\n'
)


def _fail_state(lua: Lua, eids: list[bytes], jobs: list[str]) -> dict[str, Any]:
    """Everything the scripts write, with entry ids replaced by their case's index."""
    k = lua.k
    index = {eid: i for i, eid in enumerate(eids)}
    dlq = [
        [(f, index.get(v, v) if f == "source_id" else v) for f, v in kv(fields)] for _e, fields in lua.r.xrange(k.dlq)
    ]
    records = {j: lua.r.get(k.failure(j)) for j in jobs if j}
    return {
        "delayed": lua.r.zrange(k.delayed, 0, -1, withscores=True),
        "dlq": dlq,
        "events": lua.events(),
        "records": records,
        "stream": [index[e] for e, _f in lua.stream()],
        "pending": lua.pending(),
    }


def _load_cases(lua: Lua, cases: list[dict[str, Any]]) -> list[bytes]:
    eids = [lua.pending_entry(c["fields"]) for c in cases]
    for c, eid in zip(cases, eids):
        if c.get("gone"):  # handled elsewhere first: acked, still in the stream
            assert lua.r.xack(lua.k.stream, "default", eid) == 1
    return eids


def test_fail_batch_does_what_per_entry_calls_do(lua: Lua, queue_name: str) -> None:
    """One batch of every kind of row against one call per entry: ``dead_letter`` (the queue
    trigger's script) for the DLQ rows, a one-row batch for the retries (whose effects
    ``test_retry_*`` pin to the spec)."""
    ref = Lua(lua.r, queue_name + "-ref", lua.flag == "1")
    cases = _fail_cases(lua)
    jobs = [c["job"] for c in cases]
    # reference: one call per case
    ref_eids = _load_cases(ref, cases)
    ref_replies = []
    for c, eid in zip(cases, ref_eids):
        if c["kind"] == "r":
            argv = ["default", ref.flag, 100_000, 100_000, 60_000, ref.k.prefix, NOW, 10_000]
            argv += ["r", eid, c["job"], c["name"], c["attempt"], c["failed"], c["dur"]]
            argv += [c["run_at"], c["member"], c["next"], c["backoff"], ""]
            keys = [ref.k.stream, ref.k.delayed, ref.k.dlq, ref.k.events]
            ref_replies += ref("fail_batch", keys, argv)
        else:
            argv = [
                "default",
                eid,
                ref.flag,
                100_000,
                100_000,
                NOW,
                c["payload"],
                c["name"],
                c["reason"],
                c["detail"],
                c["job"],
                c["attempt"],
                c["failed"],
                c["dur"],
                60_000,
                ref.k.prefix,
                10_000,
                b"",
                c.get("tb", ""),
            ]
            ref_replies.append(ref("dead_letter", [ref.k.stream, ref.k.dlq, ref.k.events], argv))
    # the same cases as one batch
    eids = _load_cases(lua, cases)
    argv: list[Any] = ["default", lua.flag, 100_000, 100_000, 60_000, lua.k.prefix, NOW, 10_000]
    for c, eid in zip(cases, eids):
        tail = (
            [c["run_at"], c["member"], c["next"], c["backoff"]]
            if c["kind"] == "r"
            else [c["payload"], c["reason"], c["detail"], ""]
        )
        argv += [c["kind"], eid, c["job"], c["name"], c["attempt"], c["failed"], c["dur"], *tail, c.get("tb", "")]
    k = lua.k
    keys = [k.stream, k.delayed, k.dlq, k.events]
    replies = lua("fail_batch", keys, argv)
    assert replies == ref_replies == [1, 1, 0, 1, 1, 1, 0]
    state = _fail_state(lua, eids, jobs)
    ref_state = _fail_state(ref, ref_eids, jobs)
    # On 7.0 the batch deletes what it acked with one XTRIM MINID below its newest entry
    # (lua/include/acks.lua), and an entry below that which someone else acked but left
    # in the stream (2: acked is done) goes too; one-row calls XDEL only their own entry.
    assert ref_state["stream"] == [2, 6]
    assert state["stream"] == ([2, 6] if lua.flag == "1" else [6])
    assert dict(state, stream=None) == dict(ref_state, stream=None)
    # spot checks against the spec, so the reference itself is pinned
    assert state["pending"] == 0  # nothing left pending; entry 6 (acked elsewhere, newest) remains
    assert [m for m, _s in state["delayed"]] == sorted([V8, cases[1]["member"]])
    assert sorted(s for _m, s in state["delayed"]) == [NOW + 50, NOW + 137]
    assert state["events"][1] == [
        ("e", b"retry-scheduled"),
        ("id", JOB_ID.encode()),
        ("ts", str(NOW).encode()),
        ("n", NAME.encode()),
        ("attempt", b"2"),
        ("backoff_ms", b"137"),
    ]
    assert [dict(f)["reason"] for f in state["dlq"]] == [b"retries_exhausted", b"unrecoverable", b"malformed"]
    assert [e[0][1] for e in state["events"]] == [
        b"failed",
        b"retry-scheduled",
        b"failed",
        b"retry-scheduled",
        b"failed",
        b"dlq",
        b"failed",
        b"dlq",
        b"dlq",
    ]
    assert msgpack.unpackb(state["records"]["J-unrec"], raw=False) == ["unrecoverable", REASON, NOW]
    # a handler's traceback: the DLQ's optional `detail` (no other field added) and the record's 4th element
    assert state["dlq"][0] == [
        ("d", V3),
        ("n", NAME.encode()),
        ("source_id", 3),
        ("reason", b"retries_exhausted"),
        ("detail", TB.encode()),
    ]
    assert b"detail" not in dict(state["dlq"][1])
    assert msgpack.unpackb(state["records"]["J-exhausted"], raw=False) == ["retries_exhausted", REASON, NOW, TB]
    assert state["records"]["J-gone-d"] is None and state["records"]["J-gone-r"] is None
    # a repeated batch (a client retry after a lost reply) writes nothing twice
    assert lua("fail_batch", keys, argv) == [0] * len(cases)
    assert _fail_state(lua, eids, jobs) == state


def test_fail_batch_with_events_off_writes_no_events(lua: Lua) -> None:
    k = lua.k
    cases = [c for c in _fail_cases(lua) if not c.get("gone")]
    eids = _load_cases(lua, cases)
    argv: list[Any] = ["default", lua.flag, 0, 100_000, 0, k.prefix, NOW, 10_000]
    for c, eid in zip(cases, eids):
        tail = (
            [c["run_at"], c["member"], c["next"], c["backoff"]]
            if c["kind"] == "r"
            else [c["payload"], c["reason"], c["detail"], ""]
        )
        argv += [c["kind"], eid, c["job"], c["name"], c["attempt"], c["failed"], c["dur"], *tail, c.get("tb", "")]
    assert lua("fail_batch", [k.stream, k.delayed, k.dlq, k.events], argv) == [1] * len(cases)
    assert lua.events() == [] and lua.r.zcard(k.delayed) == 2 and lua.r.xlen(k.dlq) == 3
    assert lua.r.xlen(k.stream) == 0 and lua.pending() == 0
    assert lua.r.get(k.failure("J-unrec")) is None  # failure_ttl_ms 0: no records


def test_fail_batch_checks_only_the_keys_its_rows_write(lua: Lua) -> None:
    """A retry writes the delayed set, a dead-lettering the DLQ.  A DLQ of another type used to
    refuse every retry as well (nothing acked: the worker's task crashed and restarted, and each
    failing job ran again every lease); now a retry goes through a spoiled DLQ and a
    dead-lettering through a spoiled delayed set, while a row whose own key is spoiled is
    refused with that key named and nothing acked."""
    k, r = lua.k, lua.r
    keys = [k.stream, k.delayed, k.dlq, k.events]
    head: list[Any] = ["default", lua.flag, 100_000, 100_000, 0, k.prefix, NOW, 10_000]

    def dead(eid: bytes) -> list[Any]:
        return ["d", eid, "J-d", NAME, 3, REASON, 9, V3, "retries_exhausted", "", "", ""]

    r.set(k.dlq, "junk")
    eid = lua.pending_entry({"d": V2, "n": NAME})
    assert retry(lua, eid, 5, V8, NAME) == 1
    assert r.zrange(k.delayed, 0, -1) == [V8] and lua.pending() == 0
    eid = lua.pending_entry({"d": V3, "n": NAME})
    with pytest.raises(redis.ResponseError, match=f"fail_batch: {re.escape(k.dlq)} is a string .*nothing was acked"):
        lua("fail_batch", keys, head + dead(eid))
    assert lua.pending() == 1
    r.delete(k.dlq)
    r.delete(k.delayed)
    r.set(k.delayed, "junk")
    assert lua("fail_batch", keys, head + dead(eid)) == [1]
    assert r.xlen(k.dlq) == 1 and lua.pending() == 0
    eid = lua.pending_entry({"d": V2, "n": NAME})
    refused = f"fail_batch: {re.escape(k.delayed)} is a string .*nothing was acked"
    with pytest.raises(redis.ResponseError, match=refused):
        retry(lua, eid, 5, V8, NAME)
    assert lua.pending() == 1 and r.get(k.delayed) == b"junk"


def test_fail_batch_keeps_original_name_bytes_and_caps_failure_records(lua: Lua) -> None:
    k, index = lua.k, lua.k.failures
    raw_name = b"\xfe" * 400
    for batch in range(4):
        eids = [lua.pending_entry({"d": V2, "n": raw_name}) for _ in range(5)]
        argv: list[Any] = ["default", lua.flag, 100_000, 100_000, 60_000, k.prefix, NOW + batch, 7]
        for i, eid in enumerate(eids):
            argv += ["d", eid, f"F{batch}-{i}", "", 0, "", 0, V2, "decode_failed", "too long", raw_name, ""]
        assert lua("fail_batch", [k.stream, k.delayed, k.dlq, k.events], argv) == [1] * 5
        assert lua.r.zcard(index) == min(7, 5 * (batch + 1))
    assert all(kv(f)[:2] == [("d", V2), ("n", raw_name)] for _e, f in lua.r.xrange(k.dlq))
    assert all(b"n" not in dict(e) for e in lua.events())
    kept = [f"F{b}-{i}" for b in range(4) for i in range(5) if lua.r.exists(k.failure(f"F{b}-{i}"))]
    assert kept == ["F2-3", "F2-4"] + [f"F3-{i}" for i in range(5)]
    assert 0 < lua.r.pttl(index) <= 60_000


# ---- full streams: the largest id -------------------------------------------------------------
LAST_ID = "18446744073709551615-18446744073709551615"


def _fill(r: redis.Redis, key: str, *, delete_it: bool = False) -> None:
    """``key`` can take no more entries: its last id is the largest (any writer may add it).
    With ``delete_it`` that entry is deleted again: the stream's last id stays the largest."""
    r.xadd(key, {"junk": "x"}, id=LAST_ID)
    if delete_it:
        r.xdel(key, LAST_ID)


@pytest.mark.parametrize("delete_it", [False, True], ids=["entry", "deleted"])
def test_a_full_events_stream_never_fails_a_script_after_its_writes(lua: Lua, delete_it: bool) -> None:
    """Events are best effort (wire spec 9.1).  An events stream whose last id is the largest
    refuses every ``XADD *``; the scripts failed there after their acks or moves, so a worker's
    acks never landed and every job ran again each lease, for ever.  Now the events of that
    call stop and the rest is written."""
    k, r = lua.k, lua.r
    _fill(r, k.events, delete_it=delete_it)
    events_before = r.xlen(k.events)
    e1, e2 = lua.pending_entry({"d": V2, "n": NAME}), lua.pending_entry({"d": V2})
    done = ["default", lua.flag, 100_000, 60_000, k.prefix, NOW, 10_000]
    done += [e1, "J1", NAME, 1, 842, msgpack.packb({"ok": 1}), e2, "J2", "", 2, 7, ""]
    assert lua("complete_batch", [k.stream, k.events], done) == 2
    assert lua.pending() == 0 and r.xlen(k.stream) == 0 and r.exists(k.result("J1"))

    eid = lua.pending_entry({"d": V2, "n": NAME})
    assert retry(lua, eid, 5, V8, NAME) == 1  # failed + retry-scheduled events: refused
    assert r.zrange(k.delayed, 0, -1) == [V8] and lua.pending() == 0
    eid = lua.pending_entry({"d": V3, "n": NAME})
    head: list[Any] = ["default", lua.flag, 100_000, 100_000, 0, k.prefix, NOW, 10_000]
    dead = ["d", eid, "J-d", NAME, 3, REASON, 9, V3, "retries_exhausted", "", "", ""]
    assert lua("fail_batch", [k.stream, k.delayed, k.dlq, k.events], head + dead) == [1]
    assert r.xlen(k.dlq) == 1 and lua.pending() == 0
    eid = lua.pending_entry({"d": V3, "n": NAME})
    assert lua("dead_letter", [k.stream, k.dlq, k.events], dead_letter_args(lua, eid)) == 1
    assert r.xlen(k.dlq) == 2 and lua.pending() == 0

    # the promoter moves each due job once (its `waiting` event refused)
    r.zadd(k.delayed, {encode_member(b"", V2): 1})
    assert lua("promote", [k.delayed, k.stream, k.events, k.dlq], [256, 1_000_000, 100_000, k.prefix, 1_000])[0] == 2
    assert r.zcard(k.delayed) == 0 and r.xlen(k.stream) == 2

    # a cancel ends its job; emit_events says it wrote nothing
    eid = lua.pending_entry({"d": V2, "n": NAME})
    cancel = ["default", lua.flag, 100_000, k.prefix, 60_000, NOW, eid, "J-c", NAME]
    assert lua("cancel_jobs", [k.stream, k.events, k.cancel_requests], cancel) == [1]
    assert r.exists(f"{k.prefix}:cancelled:J-c")
    assert lua("emit_events", [k.events], [100_000, 0, "active", NOW, JOB_ID, NAME, 1, "J2", "", 3]) == 0
    assert lua("emit_events", [k.events], [100_000, 1, "e", "drained"]) == 0
    assert r.xlen(k.events) == events_before  # nothing was added, and nothing failed


@pytest.mark.parametrize(("script", "spoiled"), [(s, w) for s, w in MARKED_WRITES if w == "stream"])
def test_a_write_behind_a_marker_refuses_a_full_stream_before_the_marker(lua: Lua, script: str, spoiled: str) -> None:
    """A full stream (its last id the largest) refuses ``XADD *`` as a key of another type
    refuses every write: the marker set before it would outlive the refused job."""
    k, r = lua.k, lua.r
    member = encode_member(NAME.encode(), V2)
    marker = k.unique("m-1")
    keys, argv = {
        "enqueue_batch_once": ([k.stream, k.delayed, marker], [60_000, 1_000_000, 0, V2, NAME, 5, member, ""]),
        "enqueue_batch_side_once": (
            [k.stream, k.controls, k.prioritized, k.groups, marker],
            [60_000, 1_000_000, k.prefix, 0, "", V2, NAME],
        ),
        "enqueue_batch_unique": (
            [k.stream, k.delayed, marker, k.unique("m-2")],
            [60_000, 1_000_000, "m-1", 0, V2, NAME, "m-2", 5, member, ""],
        ),
        "add_unique": ([marker, k.stream, k.delayed], [60_000, "m-1", 0, 1_000_000, V2, NAME, member]),
        "add_dedup": (
            [marker, k.stream, k.delayed, k.events],
            ["throttle", 60_000, "m-1", 1_000_000, V2, NAME, member, 0, "d"],
        ),
    }[script]
    _fill(r, k.stream, delete_it=True)
    with pytest.raises(redis.ResponseError, match=f"{script}: {re.escape(k.stream)} is full"):
        lua(script, keys, argv)
    assert not r.exists(marker), "the marker was left behind"
    r.delete(k.stream)
    lua(script, keys, argv)
    assert r.exists(marker) and r.xlen(k.stream) >= 1


def test_a_full_stream_or_dlq_never_makes_a_move_lose_or_repeat_a_job(lua: Lua) -> None:
    """The moves into a stream (promote, replay_dlq, take_prioritized, take_grouped) and into
    the DLQ (fail_batch, dead_letter, promote's malformed members) treat a full target as one
    of another type.  Before, take_prioritized popped the jobs and then failed to add them
    (lost), and fail_batch and dead_letter acked and deleted the entry before their DLQ XADD
    failed (lost)."""
    k, r = lua.k, lua.r
    promote = ([k.delayed, k.stream, k.events, k.dlq], [256, 1_000_000, 100_000, k.prefix, 1_000])
    r.zadd(k.delayed, {encode_member(b"", V2): 3, b"\x01": 4})  # the second is bound for the DLQ
    _fill(r, k.stream)
    with pytest.raises(redis.ResponseError, match=f"promote: {re.escape(k.stream)} is full"):
        lua("promote", *promote)
    assert r.zcard(k.delayed) == 2
    r.delete(k.stream)
    _fill(r, k.dlq, delete_it=True)  # the malformed member stays due, the other is promoted
    assert lua("promote", *promote)[0] == 1
    assert r.xlen(k.stream) == 1 and r.zrange(k.delayed, 0, -1) == [b"\x01"] and r.xlen(k.dlq) == 0

    # dead-lettering into a full DLQ: refused, nothing acked, the entry stays pending
    r.delete(k.stream)
    eid = lua.pending_entry({"d": V3, "n": NAME})
    with pytest.raises(redis.ResponseError, match=f"dead_letter: {re.escape(k.dlq)} is full"):
        lua("dead_letter", [k.stream, k.dlq, k.events], dead_letter_args(lua, eid))
    assert lua.pending() == 1 and r.xlen(k.stream) == 1
    head: list[Any] = ["default", lua.flag, 100_000, 100_000, 0, k.prefix, NOW, 10_000]
    dead = ["d", eid, "J-d", NAME, 3, REASON, 9, V3, "retries_exhausted", "", "", ""]
    with pytest.raises(redis.ResponseError, match=f"fail_batch: {re.escape(k.dlq)} is full .*nothing was acked"):
        lua("fail_batch", [k.stream, k.delayed, k.dlq, k.events], head + dead)
    assert lua.pending() == 1 and r.xlen(k.stream) == 1
    assert retry(lua, eid, 5, V8, NAME) == 1  # a retry does not write the DLQ: it goes through
    r.delete(k.dlq)

    # replaying into a full stream: the DLQ entry stays
    dlq_id = r.xadd(k.dlq, {"d": V2, "n": NAME, "source_id": "1-0", "reason": "retries_exhausted"})
    r.delete(k.stream)
    _fill(r, k.stream, delete_it=True)
    with pytest.raises(redis.ResponseError, match=f"replay_dlq: {re.escape(k.stream)} is full"):
        lua("replay_dlq", [k.dlq, k.stream], [1_000_000, dlq_id, V2, NAME])
    assert r.xlen(k.dlq) == 1

    # prioritized and grouped jobs: nothing popped while the stream is full
    r.zadd(k.prioritized, {encode_member(NAME.encode(), V2): 1})
    assert lua("take_prioritized", [k.prioritized, k.stream], [10, 1_000_000]) == 0
    assert r.zcard(k.prioritized) == 1
    r.rpush(k.group_jobs("acme"), encode_member(NAME.encode(), V2))
    r.zadd(k.groups, {"acme": 1})
    grouped = ([k.groups, k.stream, k.group_limits], [10, 1_000_000, 30_000, k.prefix])
    assert lua("take_grouped", *grouped) == 0
    assert r.llen(k.group_jobs("acme")) == 1
    r.delete(k.stream)
    assert lua("take_prioritized", [k.prioritized, k.stream], [10, 1_000_000]) == 1
    assert lua("take_grouped", *grouped) == 1
    assert r.xlen(k.stream) == 2 and r.zcard(k.prioritized) == 0 and r.llen(k.group_jobs("acme")) == 0
