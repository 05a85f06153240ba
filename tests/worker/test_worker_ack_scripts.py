"""The worker's per-batch scripts keep their exact effects while doing less work per job.

``complete_batch`` deletes acked entries by trimming below the group's oldest pending entry
when that is provably the same set XDEL would delete, else by XDEL; ``emit_events`` (compact
form) and ``complete_batch`` trim the events stream once per batch instead of per XADD.  Each
case compares against the plain definition: the stream keeps exactly the entries not acked,
and the events stream ends as long as per-XADD ``MAXLEN ~`` would leave it.  Matrix: Redis 7.0,
Valkey 8.1, Redis 8.2 (XACKDEL), fast paths forced off and detected.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scripts import SCRIPTS

pytestmark = pytest.mark.timeout(120)
GROUP = "default"


class Q:
    def __init__(self, r: redis.Redis, queue: str, xackdel: bool) -> None:
        self.r, self.k, self.flag = r, QueueKeys.for_queue(queue), "1" if xackdel else "0"

    def script(self, name: str, keys: list[Any], argv: list[Any]) -> Any:
        s = SCRIPTS[name]
        assert self.r.script_load(s.body) == s.sha
        return self.r.evalsha(s.sha, len(keys), *keys, *argv)

    def add(self, ids: list[str]) -> list[bytes]:
        return [self.r.xadd(self.k.stream, {"d": b"x", "n": "noop"}, id=i) for i in ids]

    def group(self, at: str = "0") -> None:
        self.r.xgroup_create(self.k.stream, GROUP, id=at, mkstream=True)

    def deliver(self, consumer: str, count: int) -> list[bytes]:
        got = self.r.xreadgroup(GROUP, consumer, {self.k.stream: ">"}, count=count)
        return [eid for _s, entries in got for eid, _f in entries]

    def complete(self, entry_ids: list[bytes], events_max: int = 100_000) -> int:
        argv: list[Any] = [GROUP, self.flag, events_max, 0, self.k.prefix, 1_700_000_000_000, 10_000]
        for n, eid in enumerate(entry_ids):
            argv += [eid, f"J{n}", "noop" if n % 2 else "", 1, 5, ""]
        return self.script("complete_batch", [self.k.stream, self.k.events], argv)

    def ids(self) -> list[bytes]:
        return [eid for eid, _f in self.r.xrange(self.k.stream)]

    def pending(self) -> list[bytes]:
        rows = self.r.xpending_range(self.k.stream, GROUP, "-", "+", 100_000)
        return [row["message_id"] for row in rows]

    def completed_ids(self) -> list[bytes]:
        return [f[b"id"] for _e, f in self.r.xrange(self.k.events) if f[b"e"] == b"completed"]


@pytest.fixture
def q(matrix_url, queue_name: str) -> Iterator[Q]:
    r = redis.Redis.from_url(matrix_url.url)
    try:
        yield Q(r, queue_name, matrix_url.kind == "redis82" and not matrix_url.force_compat)
    finally:
        r.close()


# ids whose parts differ in digit count, so a plain string order would be wrong
IDS = ["5-1", "5-2", "5-9", "5-10", "5-11", "9-1", "10-1", "10-3", "99-7", "100-0", "100-10", "1000-2"]


def _check(q: Q, everything: list[bytes], acked: set[bytes]) -> None:
    assert q.ids() == [e for e in everything if e not in acked]


def test_oldest_entries_acked_out_of_order(q: Q) -> None:
    everything = q.add(IDS)
    q.group()
    assert q.deliver("c1", 100) == everything
    batch = everything[:8]
    random.Random(7).shuffle(batch)
    assert q.complete(batch) == 8
    _check(q, everything, set(batch))
    assert q.pending() == everything[8:]
    assert q.completed_ids() == [f"J{n}".encode() for n in range(8)]


def test_every_pending_entry_acked_leaves_undelivered_ones(q: Q) -> None:
    everything = q.add(IDS)
    q.group()
    delivered = q.deliver("c1", 7)
    batch = list(reversed(delivered))
    assert q.complete(batch) == 7
    _check(q, everything, set(delivered))
    assert q.pending() == []
    assert q.deliver("c2", 100) == everything[7:]  # the rest is still there to be read


def test_an_older_entry_pending_elsewhere_stays(q: Q) -> None:
    everything = q.add(IDS)
    q.group()
    first = q.deliver("c1", 2)
    rest = q.deliver("c2", 100)
    acked = rest[:6] + first[1:]
    assert q.complete(acked) == 7
    _check(q, everything, set(acked))
    assert q.pending() == [first[0]] + rest[6:]


def test_pending_gaps_inside_the_batch(q: Q) -> None:
    everything = q.add(IDS)
    q.group()
    q.deliver("c1", 100)
    acked = [e for i, e in enumerate(everything) if i % 3 != 1]
    assert q.complete(acked) == len(acked)
    _check(q, everything, set(acked))
    assert q.pending() == [e for i, e in enumerate(everything) if i % 3 == 1]


def test_entries_the_group_never_read_are_kept(q: Q) -> None:
    """A group created past existing entries: those are not acked, so nothing may trim them."""
    everything = q.add(IDS)
    q.group(at=IDS[3])  # 5-1 .. 5-10 are never delivered to this group
    delivered = q.deliver("c1", 100)
    assert delivered == everything[4:]
    assert q.complete(delivered[:5]) == 5
    _check(q, everything, set(delivered[:5]))
    assert q.complete(delivered[5:]) == len(delivered) - 5
    _check(q, everything, set(delivered))
    assert q.ids() == everything[:4]


def test_already_acked_and_unknown_ids_get_no_event(q: Q) -> None:
    everything = q.add(IDS)
    q.group()
    q.deliver("c1", 100)
    assert q.complete(everything[:2]) == 2
    assert q.complete([everything[0], b"1-1", everything[2], everything[1]]) == 1
    _check(q, everything, set(everything[:3]))
    assert q.completed_ids() == [b"J0", b"J1", b"J2"]  # J2 is entry 2 in the second call


def test_large_batches_on_generated_ids(q: Q) -> None:
    q.group()
    everything = q.add(["*"] * 1500)
    delivered = q.deliver("c1", 1200)
    batch = delivered[:1100]
    random.Random(3).shuffle(batch)
    assert q.complete(batch) == 1100
    _check(q, everything, set(batch))
    assert q.complete(delivered[1100:]) == 100
    _check(q, everything, set(delivered))
    assert len(q.completed_ids()) == 1200
    assert q.pending() == []


def _trimmed_as_maxlen_approx(r: redis.Redis, key: str, cap: int, written: int) -> None:
    """The state XADD ``MAXLEN ~ cap`` on every event leaves: at least ``cap`` entries (or all
    written), fewer than written once past the cap plus a node, and nothing a further
    ``MAXLEN ~`` trim could remove.  (Exact lengths depend on node boundaries, which depend
    on the entry ids' timing.)"""
    n = r.xlen(key)
    assert min(written, cap) <= n <= written
    if written >= cap + 200:
        assert n < written
    assert r.xtrim(key, maxlen=cap, approximate=True) == 0


def test_events_trimmed_per_batch_as_per_xadd(q: Q) -> None:
    cap, batch, batches = 250, 120, 9
    for b in range(batches):
        argv: list[Any] = [cap, 0, "active", 1]
        for i in range(batch):
            argv += [f"J{b}-{i}", "noop" if i % 2 else "", 1]
        assert q.script("emit_events", [q.k.events], argv) == batch
        _trimmed_as_maxlen_approx(q.r, q.k.events, cap, batch * (b + 1))
    assert [f[b"id"] for _e, f in q.r.xrange(q.k.events)][-1] == f"J{batches - 1}-{batch - 1}".encode()
    q.r.delete(q.k.events)
    q.group()
    q.add(["*"] * (batch * batches))
    for b in range(batches):
        assert q.complete(q.deliver("c1", batch), events_max=cap) == batch
        _trimmed_as_maxlen_approx(q.r, q.k.events, cap, batch * (b + 1))
    assert q.ids() == []


# ---- fail_batch rows: the same decisions as the per-entry dead_letter call -------------------------


@pytest.mark.parametrize("xackdel", [False, True])
@pytest.mark.parametrize("case", ["retry", "retries_exhausted", "unrecoverable", "rejected"])
def test_fail_batch_rows_carry_the_routing_decision(case: str, xackdel: bool) -> None:
    """``failure_row``/``reject_row`` + ``fail`` (sans I/O): a DLQ row carries what the
    per-entry ``dead_letter`` call (the queue trigger's path) carries for the same entry; a
    retry row carries the next attempt's member, run-at and backoff (seeded jitter)."""
    from airflow_provider_chasqui.core.codec import Envelope, encode_envelope, encode_member
    from airflow_provider_chasqui.core.consumer import ConsumerCore, Rejected
    from airflow_provider_chasqui.core.features import Features
    from airflow_provider_chasqui.core.retry import RetryPolicy, backoff_ms
    from airflow_provider_chasqui.core.settings import QueueSettings
    from airflow_provider_chasqui.errors import UnrecoverableError

    def core() -> ConsumerCore:
        c = ConsumerCore(
            "emails",
            group="g",
            consumer_id="c",
            max_attempts=2,
            settings=QueueSettings(),
            retry=RetryPolicy(),
            events=True,
            result_ttl_ms=0,
            failure_ttl_ms=5_000,
        )
        c.rng.seed(7)
        return c

    features, now = Features(xackdel=xackdel), 1_700_000_000_000
    attempt = 1 if case == "retries_exhausted" else 0
    env = Envelope("J1", b"\x01", now - 5, attempt)
    payload = encode_envelope(env)
    a, b = core(), core()
    if case == "rejected":
        r = Rejected(b"9-1", "malformed", b"", "", "fields not an array")
        one, row = a.reject(r, features, now), b.reject_row(r)
    else:
        dl = b.gate(b"9-1", [b"d", payload, b"n", b"mail"], 1)
        try:  # raised, so it has a traceback for the DLQ rows to carry
            raise UnrecoverableError("x") if case == "unrecoverable" else ValueError("boom")
        except Exception as raised:  # noqa: BLE001
            exc = raised
        row, outcome, delay = b.failure_row(dl, exc, case == "unrecoverable", 42, now)
        assert outcome == ("retry" if case == "retry" else case)
    batch = b.fail([row], features, now)
    assert batch.script.name == "fail_batch"
    k = a.keys
    assert batch.keys == (k.stream, k.delayed, k.dlq, k.events)
    head, (kind, eid, job, name, att, failed, dur, *tail) = batch.argv[:8], batch.argv[8:]
    assert head == (
        "g",
        features.xackdel_flag,
        a.events_max,
        a.settings.dlq_max_len,
        5_000,
        k.prefix,
        now,
        a.settings.failures_max_len,
    )
    if case == "retry":
        assert (kind, eid, job, name, att, dur) == ("r", b"9-1", "J1", "mail", 1, 42)
        assert failed == "handler: Python handler raised: ValueError('boom')"
        a.rng.seed(7)  # the same draw the row's backoff took
        assert delay == backoff_ms(1, None, RetryPolicy(), a.rng) > 0
        # run-at, the next attempt's member (name prefix kept), next run (1-indexed), backoff
        assert tail[:4] == [now + delay, encode_member(b"mail", encode_envelope(env.with_attempt(1))), 2, delay]
        assert tail[4] == ""  # a retried attempt's traceback is logged, not stored
        return
    if case != "rejected":
        one = a.dead_letter(
            eid, tail[1], payload, "mail", "", "J1", att, features, now,
            failed_reason=failed, duration_us=dur, dlq_name=tail[3], traceback_text=tail[4],
        )  # fmt: skip
    assert kind == "d" and not tail[3]  # the DLQ's `n` is `name`
    assert one.script.name == "dead_letter"
    assert one.argv == (
        "g",
        eid,
        features.xackdel_flag,
        a.settings.dlq_max_len,
        a.events_max,
        now,
        tail[0],
        name,
        tail[1],
        tail[2],
        job,
        att,
        failed,
        dur,
        5_000,
        k.prefix,
        a.settings.failures_max_len,
        tail[3],
        tail[4],
    )
    if case != "rejected":
        assert (tail[0], tail[1], att) == (payload, case, attempt + 1)
    assert (tail[4].startswith("Traceback") and "in test_fail_batch_rows" in tail[4]) == (case != "rejected")
