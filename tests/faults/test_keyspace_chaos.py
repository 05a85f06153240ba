"""The keyspace chaos suite: hostile state in every key of a queue while real workers run.

Two real ``Worker`` s (each with its embedded promoter and scheduler, racing for their leader
locks) consume one queue on a real server.  Hypothesis generates batches of hostile writes into
every key of the queue's keyspace, as a buggy producer, a foreign tool or an attacker with
write access could make them: stream entries with arbitrary fields and bytes, delayed members
with any bytes and any score (+-inf included), repeat members with any bytes and score, spec
hashes that decode but carry non-integer counters or wrong-typed keys, arbitrary DLQ and events
entries, an events key of another type, foreign lock holders, wrong-typed result, failure and
unique keys, hostile job timeouts and cancel requests on real waiting jobs (issue 25), and a flow-controls
hash of any type or with foreign values (never exactly ``paused=1``: that pauses the queue).  Between the
hostile writes, well-formed jobs (immediate, delayed, and one that runs longer than the claim
lease) and two well-formed every-second specs keep flowing.

Invariants checked after every generated state and at the end:

* every well-formed job is handled exactly once, and never by two slots at the same time;
* every fire of a well-formed spec is handled at most once (a fire id never twice) and the
  specs keep firing (at least one fire per two seconds of the run);
* no worker dies, and no supervised task of a worker is reported dead (``Worker.health()``);
* the stream and the group's pending list drain, and the events stream stays within its cap;
* the viewers and the maintenance calls (counts, pages, `remove`, `clean`) read every state
  without failing.

It runs on Redis 7.0 and on Valkey 8.1.  ``CHASQUI_CHAOS_SECONDS`` sets the budget (CI: 60 s on
Redis, half of it on Valkey); a longer soak is the same test with a bigger
budget: ``CHASQUI_CHAOS_SECONDS=600 scripts/test.sh tests/faults/test_keyspace_chaos.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from engine_support import wait_until_sync
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from servers import start_server

from airflow_provider_chasqui import RepeatPattern, SyncQueue, Worker
from airflow_provider_chasqui.core.codec import decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.listing import JOB_STATES
from airflow_provider_chasqui.core.removal import CLEAN_STATES, MAX_GRACE_MS, REMOVE_PARTS

GOOD, SLOW, SPEC = "good", "slow", "spec"
LEASE_MS = 1500
EVENTS_CAP = 2000
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


class Ledger:
    """What the handlers saw, from every worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: collections.Counter[str] = collections.Counter()
        self.running: set[str] = set()
        self.overlaps: list[str] = []
        self.fires: collections.Counter[str] = collections.Counter()
        self.good_fires: dict[int, set[str]] = collections.defaultdict(set)  # well-formed spec -> its fire ids

    def enter(self, job_id: str) -> None:
        with self.lock:
            if job_id in self.running:
                self.overlaps.append(job_id)
            self.running.add(job_id)
            self.runs[job_id] += 1

    def leave(self, job_id: str) -> None:
        with self.lock:
            self.running.discard(job_id)


def _handlers(ledger: Ledger) -> dict[str, Any]:
    async def good(job: Any) -> str:
        ledger.enter(job.id)
        try:
            await asyncio.sleep(0.001 * (hash(job.id) % 20))
            return job.id
        finally:
            ledger.leave(job.id)

    async def slow(job: Any) -> str:
        ledger.enter(job.id)
        try:
            await asyncio.sleep(2.5 * LEASE_MS / 1000)  # outlives the lease: must not run twice
            return job.id
        finally:
            ledger.leave(job.id)

    def spec(job: Any) -> None:
        with ledger.lock:
            ledger.fires[job.id] += 1
            i = job.data.get("i") if isinstance(job.data, dict) else None
            if i in (0, 1):  # the well-formed specs; hostile copies carry i = -1
                ledger.good_fires[i].add(job.id)

    return {GOOD: good, SLOW: slow, SPEC: spec}


class WorkerThread:
    """A real Worker on its own event loop in a thread."""

    def __init__(self, url: str, queue: str, ledger: Ledger, n: int) -> None:
        self.worker = Worker(
            queue,
            _handlers(ledger),
            redis_url=url,
            concurrency=4,
            max_attempts=3,
            claim_min_idle_ms=LEASE_MS,
            read_block_ms=200,
            promoter_poll_ms=20,
            scheduler_tick_ms=200,
            store_results=True,
            events_max_stream_len=EVENTS_CAP,
            consumer_id=f"chaos-{n}",
            shutdown_deadline_secs=10,
        )
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"chaos-worker-{n}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self.worker.run())
        except BaseException as exc:  # noqa: BLE001 - reported by problems()
            self.error = exc
        finally:
            self.loop.close()

    def problems(self) -> list[str]:
        out = []
        if self.error is not None:
            out.append(f"{self.worker.consumer_id} crashed: {self.error!r}")
        elif not self.thread.is_alive() or not self.worker.is_running:
            out.append(f"{self.worker.consumer_id} stopped")
        health = getattr(self.worker, "health", None)
        if health is not None and self.worker.is_running:
            try:
                report = asyncio.run_coroutine_threadsafe(_call(health), self.loop).result(10)
            except Exception as exc:  # noqa: BLE001 - a health call that fails is a finding
                out.append(f"{self.worker.consumer_id} health() failed: {exc!r}")
            else:
                if any(v is False for v in _flat(report).values()):
                    out.append(f"{self.worker.consumer_id} reports unhealthy tasks: {report}")
        return out

    def consuming(self) -> bool:
        """Started and through its first contact with Redis (or crashed: problems() says)."""
        if self.error is not None or not self.worker.is_running:
            return self.error is not None
        health = getattr(self.worker, "health", None)
        return health is None or "running" not in health()

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.worker.close(), self.loop).result(60)
        self.thread.join(60)


async def _call(fn: Any) -> Any:
    out = fn()
    return await out if asyncio.iscoroutine(out) else out


def _flat(report: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(report, dict):
        return {prefix or "health": report}
    out: dict[str, Any] = {}
    for k, v in report.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# ---- hostile writes --------------------------------------------------------------------------------
_bytes = st.binary(max_size=24) | st.sampled_from([b"", b"\xff\xfe", b"\x00", b"{", b"}", b"-inf", b"nan", b"1e309"])
_scores = st.floats(allow_nan=False) | st.sampled_from([math.inf, -math.inf, 0.0, -1.0, 2.0**53])
_counters = st.sampled_from([b"abc", b"", b"1.5", b"nan", b"inf", b"-9" * 12, b"\xff", b"99999999999999999999999"])
_spec_fields = st.sampled_from([b"spec", b"fired", b"skipped", b"ext", b"paused", b"x", b""])


def _envelope_around(inner: bytes) -> bytes:
    from airflow_provider_chasqui.core.codec import Envelope, encode_envelope

    return encode_envelope(Envelope("chaos-payload", inner, int(time.time() * 1000), 0, None))


# Shapes that cost far more decoded than encoded, or more than any job may be (issue 26): 100,000
# nested one-element arrays, 300,000 empty maps (300 KB on the wire, 21 MB decoded), a 2 MiB entry.
HOSTILE_PAYLOADS = (
    _envelope_around(b"\x91" * 100_000 + b"\xc0"),
    _envelope_around(b"\xdd" + (300_000).to_bytes(4, "big") + b"\x80" * 300_000),
    b"\xff" * (2 * 1024 * 1024),
)


@st.composite
def hostile_write(draw: Any) -> tuple[Any, ...]:
    kind = draw(
        st.sampled_from(
            [
                "stream",
                "payload",
                "delayed",
                "repeat_member",
                "spec_counter",
                "spec_field",
                "spec_wrong_type",
                "spec_ext",
                "dlq",
                "events",
                "lock",
                "result",
                "failure",
                "unique",
                "controls",
                "running",
            ]
        )
    )
    return (
        kind,
        draw(_bytes),
        draw(_bytes),
        draw(_scores),
        draw(_counters),
        draw(_spec_fields),
        draw(st.sampled_from(["string", "list", "set", "zset", "hash"])),
    )


def _hostile_ext(a: bytes, b: bytes, score: float) -> bytes:
    """A spec ``ext`` whose priority, group or dedup item (issues 24, 25) is hostile: out of range,
    of a wrong type, non-finite, a group and a priority at once, a dedup of the wrong shape; or a
    valid one whose marker or side key an earlier write may have made of another type."""
    import msgpack

    head = [1, None, None, 0, None]
    text = a.decode("utf-8", "replace") or "g"
    choices = [
        [*head, 0, None],
        [*head, score, None],
        [*head, 2**40, None],
        [*head, text, None],
        [*head, None, b],
        [*head, None, "x" * 200],
        [*head, 3, text],
        [*head, None, None, [text, "throttle", score]],
        [*head, None, None, [text, text, 1000]],
        [*head, None, None, [b, "debounce", 1000]],
        [*head, None, None, [text, "throttle"]],
        [*head, 2, None],  # valid: a prioritized fire
        [*head, None, "chaos-" + a.hex()],  # valid: a grouped fire
        [*head, None, None, ["chaos-" + a.hex(), "debounce" if len(b) % 2 else "throttle", 500]],  # valid
    ]
    return msgpack.packb(choices[(len(a) + len(b)) % len(choices)], use_bin_type=True)


def _wrong_type(r: redis.Redis, key: bytes, kind: str) -> None:
    r.delete(key)
    if kind == "string":
        r.execute_command("SET", key, b"x")
    elif kind == "list":
        r.execute_command("RPUSH", key, b"x")
    elif kind == "set":
        r.execute_command("SADD", key, b"x")
    elif kind == "zset":
        r.execute_command("ZADD", key, 1, b"x")
    else:
        r.execute_command("HSET", key, b"x", b"y")


class Chaos:
    def __init__(self, r: redis.Redis, keys: QueueKeys, template: dict[bytes, bytes]) -> None:
        self.r, self.keys, self.template = r, keys, template
        self.n = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=20)

    def _member(self, raw: bytes) -> bytes:
        self.n += 1
        return b"chaos-%d-" % self.n + raw

    def apply(self, write: tuple[Any, ...]) -> None:
        kind, a, b, score, counter, field, ktype = write
        r, k = self.r, self.keys
        self.counts[kind] += 1
        now_ms = int(time.time() * 1000)
        if kind == "stream":
            r.execute_command("XADD", k.stream, "*", b"d", a, b"n", b or GOOD.encode())
        elif kind == "payload":  # well-formed envelopes around hostile data shapes, and a huge foreign entry
            r.execute_command("XADD", k.stream, "*", b"d", HOSTILE_PAYLOADS[len(a) % len(HOSTILE_PAYLOADS)], b"n", GOOD)
        elif kind == "delayed":
            r.execute_command(
                "ZADD", k.delayed, score if not math.isfinite(score) else now_ms + score % 500, self._member(a)
            )
        elif kind == "repeat_member":
            r.execute_command("ZADD", k.repeat, score if not math.isfinite(score) else now_ms, self._member(a))
        elif kind == "spec_ext":  # msgpack-valid ext items 6-8 (priority, group, dedup) with hostile values
            member = self._member(a)
            spec_key = k.repeat_spec("").encode() + member
            r.delete(spec_key)
            r.execute_command("HSET", spec_key, *[x for kv in self.template.items() for x in kv])
            r.execute_command("HSET", spec_key, b"ext", _hostile_ext(a, b, score))
            r.execute_command("ZADD", k.repeat, now_ms - 1, member)
        elif kind in ("spec_counter", "spec_field", "spec_wrong_type"):
            member = self._member(a)
            spec_key = k.repeat_spec("").encode() + member
            r.delete(spec_key)
            if kind == "spec_wrong_type":
                _wrong_type(r, spec_key, ktype)
            else:
                r.execute_command("HSET", spec_key, *[x for kv in self.template.items() for x in kv])
                if kind == "spec_counter":
                    r.execute_command("HSET", spec_key, field if field in (b"fired", b"skipped") else b"fired", counter)
                else:
                    r.execute_command("HSET", spec_key, field, b)
            r.execute_command("ZADD", k.repeat, now_ms - 1, member)
        elif kind == "dlq":
            r.execute_command("XADD", k.dlq, "*", a or b"x", b)
        elif kind == "events":  # entries of any shape, or another type (every event is then skipped)
            if ktype == "string":
                _wrong_type(r, k.events.encode(), ktype)
            else:
                if r.type(k.events) not in (b"stream", b"none"):
                    r.delete(k.events)
                r.execute_command("XADD", k.events, "*", a or b"x", b)
        elif kind == "lock":
            lock = k.promoter_lock if score >= 0 else k.scheduler_lock
            r.execute_command("SET", lock, a or b"intruder", "PX", 300)
        elif kind == "result":
            _wrong_type(r, k.result("chaos-" + a.hex()).encode(), ktype)
        elif kind == "failure":
            _wrong_type(r, k.failure("chaos-" + a.hex()).encode(), ktype)
        elif kind == "controls":  # a foreign value is no control; only the exact values written by the API count
            if ktype == "hash":
                r.delete(k.controls)
                r.execute_command(
                    "HSET",
                    k.controls,
                    b"paused",
                    a if a != b"1" else b"1\x00",
                    b"x-" + b,
                    a,
                    b"concurrency",
                    a + b"!",
                    b"rate_max",
                    b + b"!",
                    b"rate_per_ms",
                    a,
                )
            else:
                _wrong_type(r, k.controls.encode(), ktype)
            _wrong_type(r, k.running.encode(), ktype)  # the concurrency slots: replaced, never obeyed
            # a prioritized set of another type moves nothing; hostile members reach the stream whole and
            # are dead-lettered by the gate (a queue that "uses priorities": prio_seq is set)
            if ktype == "hash":
                r.execute_command("HSET", k.controls, b"prio_seq", a, b"grouped", b)
                r.delete(k.prioritized, k.groups, k.group_limits)  # an earlier write may have left another type
                r.execute_command("ZADD", k.prioritized, score, a + b)  # not a name + envelope: dead-lettered
                # a job group with a hostile member and hostile limits (no limit): moved, then dead-lettered
                group = b"chaos-" + a.hex().encode()
                r.delete(k.prefix.encode() + b":group:" + group)
                r.execute_command("RPUSH", k.prefix.encode() + b":group:" + group, b + a)
                r.execute_command("ZADD", k.groups, score, group)
                r.execute_command("HSET", k.group_limits, b"dc", a + b"x", b"r:" + group, b)
            else:
                _wrong_type(r, k.prioritized.encode(), ktype)
                _wrong_type(r, k.groups.encode(), ktype)
                _wrong_type(r, k.group_limits.encode(), ktype)
        elif kind == "running":  # issue 25: job timeouts and cancel requests, hostile or of another type
            if r.type(k.controls) in (b"hash", b"none"):  # an earlier write may have left another type
                r.execute_command("HSET", k.controls, b"timeouts", a, b"cancels", b)  # the queue "uses" both
            ids = []
            for _eid, fields in r.execute_command("XREVRANGE", k.stream, "+", "-", "COUNT", 3) or []:
                with contextlib.suppress(Exception):
                    ids.append(decode_envelope(dict(zip(fields[::2], fields[1::2]))[b"d"]).id)
            if ktype == "hash":
                r.delete(k.cancel_requests)  # an earlier write may have left another type
            for jid in ids:  # real waiting jobs: values no producer writes (never a timeout, never a request)
                r.execute_command("SET", k.job_timeout(jid), a + b"x")
                if ktype == "hash":
                    r.execute_command("HSET", k.cancel_requests, jid, b + b"x")
            if ktype != "hash":
                _wrong_type(r, k.cancel_requests.encode(), ktype)
            _wrong_type(r, k.job_timeout("chaos-" + a.hex()).encode(), ktype)
            _wrong_type(r, k.cancelled("chaos-" + b.hex()).encode(), ktype)
        else:
            _wrong_type(r, k.unique("chaos-" + a.hex()).encode(), ktype)


# ---- the run ----------------------------------------------------------------------------------------
def _problems(workers: list[WorkerThread], ledger: Ledger) -> list[str]:
    out = [p for w in workers for p in w.problems()]
    with ledger.lock:
        if ledger.overlaps:
            out.append(f"jobs ran twice at the same time: {ledger.overlaps[:5]}")
        twice = [j for j, c in ledger.runs.items() if c > 1]
        if twice:
            out.append(f"well-formed jobs ran more than once: {twice[:5]}")
        fired_twice = [j for j, c in ledger.fires.items() if c > 1]
        if fired_twice:
            out.append(f"a fire was handled twice: {fired_twice[:5]}")
    return out


def _drained(r: redis.Redis, keys: QueueKeys) -> bool:
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("XLEN", keys.stream)
    pipe.execute_command("XPENDING", keys.stream, "default")
    xlen, pel = pipe.execute()
    return int(xlen) == 0 and int(pel[0]) == 0


def _view(q: SyncQueue) -> None:
    """What viewers and maintenance read amid the hostile state, never failing: the counts,
    a page of each state, a removal of an absent id, a clean that no well-formed job is old
    enough for (hostile entries with ancient ids may go)."""
    q.get_job_counts()
    for state in JOB_STATES:
        q.get_jobs(state, 0, 20)
    assert q.remove_report("chaos-absent") == dict.fromkeys(REMOVE_PARTS, False)
    for state in CLEAN_STATES:
        q.clean(MAX_GRACE_MS, 10, state)


def run_chaos(url: str, queue: str, budget_s: float) -> None:
    keys = QueueKeys.for_queue(queue)
    ledger = Ledger()
    r = redis.Redis.from_url(url, protocol=2)
    r.response_callbacks.clear()
    q = SyncQueue(queue, redis_url=url)
    specs = [
        q.upsert_repeatable_job(SPEC, {"i": i}, repeat=RepeatPattern.every(1000), key=f"good-spec-{i}").id
        for i in range(2)
    ]
    # hostile spec hashes start as copies of a valid spec whose fires say i = -1
    model = q.upsert_repeatable_job(SPEC, {"i": -1}, repeat=RepeatPattern.every(1000), key="model-spec").id
    template = dict(zip(*[iter(r.execute_command("HGETALL", keys.repeat_spec(model)))] * 2))
    q.remove_repeatable_by_key(model)
    chaos = Chaos(r, keys, template)
    workers = [WorkerThread(url, queue, ledger, n) for n in range(2)]
    wait_until_sync(lambda: all(w.consuming() for w in workers), 60, what="both workers to consume")
    started = time.monotonic()
    deadline = started + budget_s
    expected: list[str] = []
    states = 0
    try:
        # The system's state accumulates across examples, so shrinking would only replay a
        # later, innocent example: generate only, and report the recent writes with a finding.
        @settings(
            max_examples=max(5, int(budget_s * 20)),
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(hostile_write(), min_size=1, max_size=6), st.booleans())
        def state(writes: list[tuple[Any, ...]], with_slow: bool) -> None:
            nonlocal states
            if time.monotonic() > deadline:
                return
            for w in writes:
                chaos.apply(w)
                chaos.recent.append(w)
            _view(q)
            batch = [q.add(GOOD, {"n": len(expected)}).id, q.add(GOOD, {}, delay=0.05).id]
            if with_slow and sum(1 for j in expected if j.startswith("slow:")) < 3:
                batch.append("slow:" + q.add(SLOW, {}).id)
            expected.extend(batch)
            ids = [j.removeprefix("slow:") for j in batch]
            wait_until_sync(
                lambda: (
                    all(ledger.runs[j] >= 1 for j in ids if not j.startswith("slow:"))
                    or bool(_problems(workers, ledger))
                ),
                60,
                what="the well-formed jobs of a chaos state",
            )
            problems = _problems(workers, ledger)
            assert not problems, (problems, "recent hostile writes:", list(chaos.recent))
            states += 1

        state()
        want = [j.removeprefix("slow:") for j in expected]
        wait_until_sync(
            lambda: all(ledger.runs[j] >= 1 for j in want) or bool(_problems(workers, ledger)),
            90,
            what="every well-formed job to run",
        )
        wait_until_sync(lambda: _drained(r, keys), 60, what="the stream and the pending list to drain")
        problems = _problems(workers, ledger)
        assert not problems, problems
        missing = [j for j in want if ledger.runs[j] != 1]
        assert not missing, f"well-formed jobs not run exactly once: {missing[:5]}"
        elapsed = time.monotonic() - started
        for i in range(len(specs)):  # the well-formed specs kept firing through the run (each window once: above)
            assert len(ledger.good_fires[i]) >= 0.8 * elapsed - 3, (i, len(ledger.good_fires[i]), elapsed)
        if r.type(keys.events) == b"stream":  # (the last hostile write may have left another type)
            assert int(r.execute_command("XLEN", keys.events)) <= EVENTS_CAP * 2
    finally:
        for w in workers:
            w.stop()
        q.close()
        r.close()
    assert all(w.error is None for w in workers), [w.error for w in workers]
    print(
        f"\n[keyspace chaos] {states} generated states in {time.monotonic() - started:.0f}s, "
        f"{sum(chaos.counts.values())} hostile writes {dict(chaos.counts)}, {len(expected)} well-formed jobs, "
        f"{sum(len(f) for f in ledger.good_fires.values())} fires of the well-formed specs, "
        f"{len(ledger.fires)} fires in all"
    )


# the run's length: CI runs 30 s (about 300 states); CHASQUI_CHAOS_SECONDS=600 for a long one
BUDGET_S = float(os.environ.get("CHASQUI_CHAOS_SECONDS", "30"))


@pytest.mark.slow
@pytest.mark.timeout(300 + 2 * int(BUDGET_S))
def test_keyspace_chaos(redis_url: str, queue_name: str) -> None:
    """Redis 7.0 (the shared server): the whole budget."""
    run_chaos(redis_url, queue_name, BUDGET_S)


@pytest.mark.slow
@pytest.mark.timeout(300 + int(BUDGET_S))
def test_keyspace_chaos_valkey8(tmp_path: Path, queue_name: str) -> None:
    """Valkey 8.1 (a private server on a free port): half the budget."""
    server = start_server("valkey8", tmpdir=tmp_path)
    try:
        run_chaos(server.url, queue_name, BUDGET_S / 2)
    finally:
        server.stop()
