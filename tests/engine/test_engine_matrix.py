"""The worker's core paths on every server of the matrix (Redis 7.0, Valkey 8.1, Redis 8.2),
each with the server fast paths forced off and auto-detected (XACKDEL on 8.2)."""

from __future__ import annotations

import asyncio
import re

import msgpack
import pytest
from engine_support import events_of, kv, pending_count, running, wait_until
from wire_vectors import V13

from airflow_provider_chasqui import BackoffSpec, Job
from airflow_provider_chasqui.core.codec import Envelope, decode_envelope, encode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.retry import RetryPolicy

REASON = "handler: Python handler raised: ValueError('boom')"
ENTRY_ID = re.compile(r"^\d+-\d+$")


def fast(matrix_url) -> bool:
    return not matrix_url.force_compat


def of_job(events: list[dict[str, str]], job_id: str) -> list[dict[str, str]]:
    return [e for e in events if e["id"] == job_id]


def assert_ts(event: dict[str, str]) -> None:
    assert event["ts"].isdigit() and len(event["ts"]) == 13, event


async def test_success_path_events_and_acks(matrix_url, queue_name, clients, queues, worker_factory) -> None:
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    w = worker_factory(queue_name, handler, url, fast_paths=fast(matrix_url), concurrency=4)
    named = await q.add("send-email", {"to": "ada@example.com"})
    unnamed = await q.add("", [1, 2, 3])
    async with running(w):
        await wait_until(lambda: events_of(r, queue_name), what="events")
        evs = await wait_until(
            lambda: _events_when(
                r, queue_name, lambda es: sum(e["e"] == "completed" for e in es) == 2 and es[-1]["e"] == "drained"
            ),
            what="two completed events then drained",
        )
        assert w._intake.features.xackdel is (matrix_url.kind == "redis82" and fast(matrix_url))
    # the handler saw exactly what was added
    by_id = {j.id: j for j in seen}
    assert set(by_id) == {named.id, unnamed.id}
    assert (by_id[named.id].name, by_id[named.id].data, by_id[named.id].attempt) == (
        "send-email",
        {"to": "ada@example.com"},
        0,
    )
    assert by_id[named.id].created_at_ms == named.created_at_ms
    assert (by_id[unnamed.id].name, by_id[unnamed.id].data) == ("", [1, 2, 3])
    # events per spec 9: active then completed, exact field order, `n` only when named
    a, c = of_job(evs, named.id)
    assert list(a) == ["e", "id", "ts", "n", "attempt"] and (a["e"], a["n"], a["attempt"]) == (
        "active",
        "send-email",
        "1",
    )
    assert list(c) == ["e", "id", "ts", "n", "attempt", "duration_us"]
    assert (c["e"], c["n"], c["attempt"]) == ("completed", "send-email", "1") and c["duration_us"].isdigit()
    a, c = of_job(evs, unnamed.id)
    assert list(a) == ["e", "id", "ts", "attempt"] and a["e"] == "active"
    assert list(c) == ["e", "id", "ts", "attempt", "duration_us"] and c["e"] == "completed"
    for e in evs:
        assert_ts(e)
    assert evs[-1] == {"e": "drained", "id": "", "ts": evs[-1]["ts"]}
    assert [e["e"] for e in evs if e["id"]].count("waiting") == 0  # immediate jobs are never "waiting"
    # acknowledged means deleted: nothing left in the stream or the PEL
    assert await r.xlen(k.stream) == 0
    assert await pending_count(r, queue_name) == 0


async def _events_when(r, queue, pred):
    evs = await events_of(r, queue)
    return evs if evs and pred(evs) else None


async def test_retries_through_the_delayed_set_end_in_the_dlq(
    matrix_url, queue_name, clients, queues, worker_factory
) -> None:
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    runs: dict[str, list[int]] = {}

    async def handler(job: Job) -> None:
        runs.setdefault(job.id, []).append(job.attempt)
        raise ValueError("boom")

    w = worker_factory(
        queue_name,
        handler,
        url,
        fast_paths=fast(matrix_url),
        max_attempts=2,
        retry=RetryPolicy(initial_ms=5, max_ms=1000, multiplier=2.0, jitter_ms=0),
        promoter_poll_ms=20,
    )
    # per-job override: 3 runs, exponential 10 ms x2 without jitter
    custom = await q.add(
        "send-email", {"n": 1}, attempts=3, backoff=BackoffSpec.exponential(10, multiplier=2.0, jitter_ms=0)
    )
    default = await q.add("", {"n": 2})  # the worker-wide max_attempts=2 and queue retry policy
    async with running(w):
        evs = await wait_until(
            lambda: _events_when(r, queue_name, lambda es: sum(e["e"] == "dlq" for e in es) == 2),
            timeout=30,
            what="both jobs dead-lettered",
        )
    assert runs == {custom.id: [0, 1, 2], default.id: [0, 1]}

    seq = [(e["e"], e.get("attempt"), e.get("backoff_ms")) for e in of_job(evs, custom.id)]
    assert seq == [
        ("active", "1", None),
        ("failed", "1", None),
        ("retry-scheduled", "2", "10"),
        ("waiting", None, None),
        ("active", "2", None),
        ("failed", "2", None),
        ("retry-scheduled", "3", "20"),
        ("waiting", None, None),
        ("active", "3", None),
        ("failed", "3", None),
        ("dlq", "3", None),
    ]
    for e in of_job(evs, custom.id):
        assert_ts(e)
        if e["e"] == "failed":
            assert list(e) == ["e", "id", "ts", "n", "attempt", "reason", "duration_us"]
            assert e["reason"] == REASON and e["n"] == "send-email"
        elif e["e"] == "retry-scheduled":
            assert list(e) == ["e", "id", "ts", "n", "attempt", "backoff_ms"]
        elif e["e"] == "waiting":
            assert list(e) == ["e", "id", "ts"]  # never carries n
        elif e["e"] == "dlq":
            assert list(e) == ["e", "id", "ts", "n", "attempt", "reason"] and e["reason"] == "retries_exhausted"
    seq = [(e["e"], e.get("attempt"), e.get("backoff_ms")) for e in of_job(evs, default.id)]
    assert seq == [
        ("active", "1", None),
        ("failed", "1", None),
        ("retry-scheduled", "2", "5"),
        ("waiting", None, None),
        ("active", "2", None),
        ("failed", "2", None),
        ("dlq", "2", None),
    ]

    dlq = await r.xrange(k.dlq)
    assert len(dlq) == 2
    by_job = {decode_envelope(dict(kv(f))["d"]).id: kv(f) for _id, f in dlq}
    fields = by_job[custom.id]
    # ChasquiMQ's fields in its order, plus its optional `detail`: here the handler's traceback
    assert [name for name, _ in fields] == ["d", "n", "source_id", "reason", "detail"]
    d = dict(fields)
    assert d["detail"].startswith(b"Traceback (most recent call last):") and d["detail"].endswith(b"ValueError: boom\n")
    env = decode_envelope(d["d"])
    # re-encoded by the worker with attempt NOT bumped: the failing run's attempt (2), override kept
    assert env.attempt == 2 and env.retry is not None and env.retry.max_attempts == 3
    assert d["d"] == encode_envelope(Envelope(custom.id, msgpack.packb({"n": 1}), custom.created_at_ms, 2, env.retry))
    assert (d["n"], d["reason"]) == (b"send-email", b"retries_exhausted")
    assert ENTRY_ID.match(d["source_id"].decode())
    fields = dict(by_job[default.id])
    assert list(fields) == ["d", "source_id", "reason", "detail"]  # unnamed: no n
    assert decode_envelope(fields["d"]).attempt == 1
    assert await r.xlen(k.stream) == 0 and await r.zcard(k.delayed) == 0
    assert await pending_count(r, queue_name) == 0


async def test_malformed_entries_go_to_the_dlq_and_the_worker_keeps_going(
    matrix_url, queue_name, clients, queues, worker_factory
) -> None:
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    big = encode_envelope(Envelope("BIG", msgpack.packb("x" * 600), 1, 0))
    str_payload = msgpack.packb(["STR", "a str, not bin", 1, 0], use_bin_type=True)
    ids = {
        "no-d": await r.xadd(k.stream, {"x": "y"}),
        "no-d-named": await r.xadd(k.stream, {"n": "named", "x": "y"}),
        "not-msgpack": await r.xadd(k.stream, {"d": b"\xc1\xc1", "n": "nm"}),
        "str-payload": await r.xadd(k.stream, {"d": str_payload, "n": "nm"}),
        "v13": await r.xadd(k.stream, {"d": V13}),
        "oversize": await r.xadd(k.stream, {"d": big, "n": "big"}),
    }
    done: list[str] = []

    async def handler(job: Job) -> str:
        done.append(job.data)
        return job.data

    w = worker_factory(queue_name, handler, url, fast_paths=fast(matrix_url), max_payload_bytes=512)
    async with running(w):
        await q.add("good", "first")
        await wait_until(lambda: done == ["first"], what="the good job")
        await wait_until(lambda: _len(r, k.dlq, 6), what="six dead letters")
        await q.add("good", "after")  # still consuming
        await wait_until(lambda: done == ["first", "after"], what="a job after the malformed ones")
    by_source = {dict(kv(f))["source_id"]: kv(f) for _id, f in await r.xrange(k.dlq)}
    assert set(by_source) == set(ids.values())
    malformed = [
        ("d", b""),
        ("source_id", ids["no-d"]),
        ("reason", b"malformed"),
        ("detail", b"missing or non-bytes payload field"),
    ]
    assert by_source[ids["no-d"]] == malformed
    assert by_source[ids["no-d-named"]] == [
        ("d", b""),
        ("n", b"named"),
        ("source_id", ids["no-d-named"]),
        ("reason", b"malformed"),
        ("detail", b"missing or non-bytes payload field"),
    ]
    # decode_failed: the original `d` and `n` bytes (spec 7.2 drops the name; we keep it) and a
    # detail naming what failed (an optional field ChasquiMQ's readers accept)
    assert by_source[ids["not-msgpack"]][:4] == [
        ("d", b"\xc1\xc1"),
        ("n", b"nm"),
        ("source_id", ids["not-msgpack"]),
        ("reason", b"decode_failed"),
    ]
    assert by_source[ids["not-msgpack"]][4][1].startswith(b"envelope is not valid msgpack")
    assert by_source[ids["str-payload"]] == [
        ("d", str_payload),
        ("n", b"nm"),
        ("source_id", ids["str-payload"]),
        ("reason", b"decode_failed"),
        ("detail", b"envelope payload must be msgpack bin"),
    ]
    assert by_source[ids["v13"]] == [
        ("d", V13),
        ("source_id", ids["v13"]),
        ("reason", b"decode_failed"),
        ("detail", b"envelope payload must be msgpack bin"),
    ]
    # oversize: checked before decoding, original bytes, the name kept
    assert by_source[ids["oversize"]] == [
        ("d", big),
        ("n", b"big"),
        ("source_id", ids["oversize"]),
        ("reason", b"oversize_payload"),
    ]
    dlq_events = [e for e in await events_of(r, queue_name) if e["e"] == "dlq"]
    assert sorted(e["reason"] for e in dlq_events) == sorted(
        ["malformed", "malformed", "decode_failed", "decode_failed", "decode_failed", "oversize_payload"]
    )
    for e in dlq_events:
        assert list(e) == ["e", "id", "ts", "attempt", "reason"] and e["id"] == "" and e["attempt"] == "0"
    assert await r.xlen(k.stream) == 0
    assert await pending_count(r, queue_name) == 0


async def _len(r, key, n) -> bool:
    return await r.xlen(key) == n


async def test_entries_of_a_dead_consumer_are_reclaimed_and_exhausted_ones_dlqd(
    matrix_url, queue_name, clients, queues, worker_factory
) -> None:
    """The delivery-count gate (spec 13.3): XPENDING + XCLAIM after claim_min_idle_ms."""
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    fresh = [await q.add("r", {"i": i}) for i in range(2)]
    worn = await q.add("r", {"i": "worn"})
    got = await r.xreadgroup("default", "dead-consumer", {k.stream: ">"}, count=10)
    entry_ids = [eid for _s, entries in got for eid, _f in entries]
    assert len(entry_ids) == 3
    raw_worn = dict(kv((await r.xrange(k.stream, entry_ids[2], entry_ids[2]))[0][1]))["d"]
    # the third was already delivered 5 times (crashes): RETRYCOUNT sets the PEL counter
    await r.xclaim(k.stream, "default", "dead-consumer", 0, [entry_ids[2]], retrycount=5, justid=True)
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    w = worker_factory(queue_name, handler, url, fast_paths=fast(matrix_url), max_attempts=3, claim_min_idle_ms=300)
    async with running(w):
        await wait_until(lambda: len(seen) == 2, what="two reclaimed jobs run")
        await wait_until(lambda: _len(r, k.dlq, 1), what="the worn entry dead-lettered")
        await wait_until(lambda: pending_count_is(r, queue_name, 0), what="nothing pending")
    assert sorted(j.id for j in seen) == sorted(j.id for j in fresh)
    assert all(j.attempt == 0 for j in seen)  # dispatched unchanged: attempt not raised to the claim count
    ((_id, fields),) = await r.xrange(k.dlq)
    assert kv(fields) == [("d", raw_worn), ("n", b"r"), ("source_id", entry_ids[2]), ("reason", b"retries_exhausted")]
    (dlq_event,) = [e for e in await events_of(r, queue_name) if e["e"] == "dlq"]
    assert dlq_event == {
        "e": "dlq",
        "id": worn.id,
        "ts": dlq_event["ts"],
        "n": "r",
        "attempt": "5",
        "reason": "retries_exhausted",
    }
    assert await r.xlen(k.stream) == 0
    info = await r.xinfo_consumers(k.stream, "default")
    assert {c["name"]: c["pending"] for c in info}.get(b"dead-consumer", 0) == 0


async def pending_count_is(r, queue, n) -> bool:
    return await pending_count(r, queue) == n


async def test_delayed_job_keeps_its_name(matrix_url, queue_name, clients, queues, worker_factory) -> None:
    url = matrix_url.url
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    w = worker_factory(queue_name, handler, url, fast_paths=fast(matrix_url), promoter_poll_ms=20)
    job = await q.add("send-email", {"to": "x"}, delay=50)
    async with running(w):
        await wait_until(lambda: seen, what="the delayed job")
    assert [(j.id, j.name, j.data, j.attempt) for j in seen] == [(job.id, "send-email", {"to": "x"}, 0)]


@pytest.mark.parametrize("n_jobs", [300])
async def test_many_jobs_all_acked(matrix_url, queue_name, clients, queues, worker_factory, n_jobs) -> None:
    """Acks are batched (up to 256 per script call); every one lands."""
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    count = 0

    async def handler(job: Job) -> None:
        nonlocal count
        count += 1
        await asyncio.sleep(0)

    await q.add_bulk([{"name": "bulk", "data": i} for i in range(n_jobs)])
    w = worker_factory(queue_name, handler, url, fast_paths=fast(matrix_url), concurrency=50)
    async with running(w):
        await wait_until(lambda: count == n_jobs, what="all jobs handled")
        await wait_until(lambda: _len(r, k.stream, 0), what="all acked and deleted")
    assert await pending_count(r, queue_name) == 0
    completed = [e for e in await events_of(r, queue_name) if e["e"] == "completed"]
    assert len(completed) == n_jobs


async def test_a_deleted_entry_still_pending_does_not_wedge_recovery(
    matrix_url, queue_name, clients, queues, worker_factory
) -> None:
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url, fast_paths=fast(matrix_url))
    await r.xgroup_create(k.stream, "default", id="0", mkstream=True)
    await q.add("gone", 1)
    got = await r.xreadgroup("default", "dead-consumer", {k.stream: ">"}, count=10)
    ((_s, [(eid, _f)]),) = got
    await r.xdel(k.stream, eid)  # deleted, but still in the PEL of the dead consumer
    seen: list[int] = []
    w = worker_factory(
        queue_name, lambda job: seen.append(job.data), url, fast_paths=fast(matrix_url), claim_min_idle_ms=200
    )
    async with running(w):
        await q.add("fresh", 2)
        await wait_until(lambda: seen == [2], what="the fresh job")
        # the dangling PEL entry is claimed away (dropped by XCLAIM) or dead-lettered as malformed
        await wait_until(lambda: pending_count_is(r, queue_name, 0), timeout=20, what="the PEL emptied")
    for _id, fields in await r.xrange(k.dlq):
        assert dict(kv(fields))["reason"] == b"malformed"
