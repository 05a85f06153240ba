"""Fuzzing a live worker: hostile stream entries, names, envelopes and delayed members.

A real worker (with its embedded promoter) consumes a queue on the shared Redis from a
background thread while hypothesis, then plain random bytes, write entries straight into the
stream and members straight into the delayed set, as a buggy or hostile producer could.

Proven for every example: the worker never crashes (its thread keeps running and a good job
still runs afterwards), every entry is either run by its handler or dead-lettered exactly
once with the reason the arrival gate owes it (``malformed``, ``oversize_payload``,
``decode_failed``, ``retries_exhausted``, or ``unrecoverable`` for a name with no handler),
and the stream and its PEL end empty.  Delayed members that cannot be parsed still reach
the DLQ and never stall the promoter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import struct
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis
from engine_support import wait_until_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui import Worker
from airflow_provider_chasqui.core.codec import Envelope, RetryOverride, decode_data, decode_envelope, encode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys

MAX_PAYLOAD = 4096
MAX_ATTEMPTS = 3
HANDLED = "ok"
REASONS = {"malformed", "oversize_payload", "decode_failed", "retries_exhausted", "unrecoverable"}
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


# ---- the oracle: what the arrival gate owes an entry --------------------------------------------
def expected_outcome(pairs: list[tuple[bytes, bytes]]) -> str:
    """``"ran"`` or a DLQ reason, from the entry's raw field/value pairs (last ``d`` wins)."""
    d = n = None
    for k, v in pairs:
        if k == b"d":
            d = v
        elif k == b"n":
            n = v
    if d is None:
        return "malformed"
    if len(d) > MAX_PAYLOAD:
        return "oversize_payload"
    try:
        env = decode_envelope(d)
        decode_data(env.inner)
    except Exception:  # noqa: BLE001 - the codec is tested byte for byte elsewhere
        return "decode_failed"
    limit = env.retry.max_attempts if env.retry and env.retry.max_attempts is not None else MAX_ATTEMPTS
    if env.attempt + 1 > limit:
        return "retries_exhausted"
    name = n.decode("utf-8", "replace") if n is not None else ""
    return "ran" if name == HANDLED else "unrecoverable"


# ---- strategies --------------------------------------------------------------------------------
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_data = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_counter = iter(range(10**9))


@st.composite
def valid_envelopes(draw: Any) -> bytes:
    retry = draw(st.none() | st.builds(RetryOverride, st.none() | st.integers(0, 5)))
    env = Envelope(
        f"fz-{next(_counter)}", _packb(draw(_data)), draw(st.integers(0, 2**48)), draw(st.integers(0, 4)), retry
    )
    return encode_envelope(env)


_msgpack_junk = st.recursive(
    _scalars | st.just(b"x" * 3),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
).map(_packb)
_payloads = st.one_of(
    valid_envelopes(),
    _msgpack_junk,  # msgpack, but not an envelope (wrong arity, types, map form...)
    st.binary(max_size=64),  # random bytes
    valid_envelopes().map(lambda b: b[:-1]),  # truncated
    valid_envelopes().map(lambda b: b + b"\x00"),  # trailing garbage
    st.integers(MAX_PAYLOAD + 1, MAX_PAYLOAD + 3000).map(lambda k: b"\x94" + b"\xa0" * k),  # oversize
)
_names = st.one_of(
    st.just(HANDLED.encode()),
    st.binary(max_size=12),
    st.text(max_size=12).map(str.encode),
    st.just(b"\xff\xfe"),
    st.just(b""),
)
_field_names = st.sampled_from([b"d", b"n", b"x", b"", b"D", b"d\x00"]) | st.binary(max_size=4)


@st.composite
def entries(draw: Any) -> list[tuple[bytes, bytes]]:
    """Mostly ``d`` (+ ``n``), sometimes arbitrary fields, duplicates, or no ``d`` at all; a
    quarter are well-formed jobs, so good and bad entries share batches."""
    kind = draw(st.integers(0, 7))
    if kind < 2:
        return [(b"d", draw(valid_envelopes())), (b"n", HANDLED.encode())]
    if kind == 2:
        return draw(st.lists(st.tuples(_field_names, _payloads | st.binary(max_size=16)), min_size=1, max_size=4))
    pairs = [(b"d", draw(_payloads))]
    if draw(st.booleans()):
        pairs.append((b"n", draw(_names)))
    if draw(st.integers(0, 5)) == 0:
        pairs.insert(draw(st.integers(0, len(pairs))), (draw(_field_names), draw(st.binary(max_size=16))))
    return pairs


# ---- a worker in a background thread ---------------------------------------------------------------
class WorkerThread:
    def __init__(self, url: str, queue: str) -> None:
        self.ran: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

        def ok(job: Any) -> None:
            with self.lock:
                self.ran[job.id] += 1

        self.worker = Worker(
            queue,
            {HANDLED: ok},
            redis_url=url,
            max_attempts=MAX_ATTEMPTS,
            run_scheduler=False,
            claim_min_idle_ms=1000,
            read_block_ms=200,
            promoter_poll_ms=20,
            max_payload_bytes=MAX_PAYLOAD,
        )
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="fuzz-worker", daemon=True)

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self.worker.run())
        except BaseException as exc:  # noqa: BLE001 - reported by alive()
            self.error = exc
        finally:
            self.loop.close()

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.worker.close(), self.loop).result(30)
        self.thread.join(30)
        assert self.error is None, f"the worker crashed: {self.error!r}"


@contextlib.contextmanager
def worker_thread(url: str, queue: str) -> Iterator[WorkerThread]:
    wt = WorkerThread(url, queue)
    wt.thread.start()
    try:
        yield wt
    finally:
        wt.stop()


def _client(url: str) -> redis.Redis:
    r = redis.Redis.from_url(url, protocol=2)
    r.response_callbacks.clear()
    return r


def _ensure_group(r: redis.Redis, keys: QueueKeys) -> None:
    """The worker thread may have created it already."""
    try:
        r.execute_command("XGROUP", "CREATE", keys.stream, "default", "0", "MKSTREAM")
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _dlq_since(r: redis.Redis, keys: QueueKeys, last: bytes) -> list[dict[bytes, bytes]]:
    rows = (
        r.execute_command("XRANGE", keys.dlq, b"(" + last, "+")
        if last
        else r.execute_command("XRANGE", keys.dlq, "-", "+")
    )
    out = []
    for eid, flat in rows:
        f = dict(zip(flat[::2], flat[1::2]))
        f[b"__id__"] = eid
        out.append(f)
    return out


def _settled(r: redis.Redis, keys: QueueKeys) -> bool:
    """Delayed set, stream and PEL all empty, read atomically (MULTI): read one by one, a
    promotion between the reads would look like "nothing left"."""
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("ZCARD", keys.delayed)
    pipe.execute_command("XLEN", keys.stream)
    pipe.execute_command("XPENDING", keys.stream, "default")
    zcard, xlen, pel = pipe.execute()
    return int(zcard) == 0 and int(xlen) == 0 and int(pel[0]) == 0


def _good_job(r: redis.Redis, keys: QueueKeys, wt: WorkerThread) -> None:
    """A well-formed job after the fuzz still runs: the worker is alive and consuming."""
    jid = f"alive-{next(_counter)}"
    r.execute_command("XADD", keys.stream, "*", "d", encode_envelope(Envelope(jid, _packb({}), 1, 0)), "n", HANDLED)
    wait_until_sync(lambda: wt.ran[jid] == 1 or not wt.alive(), 30, what="a good job after the fuzz")
    assert wt.alive(), wt.error


# ---- the tests -------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_fuzzed_stream_entries_run_or_dead_letter(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    tally: collections.Counter[str] = collections.Counter()
    with worker_thread(redis_url, queue_name) as wt, _client(redis_url) as r:
        _ensure_group(r, keys)

        @settings(
            max_examples=200,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(entries(), min_size=1, max_size=12))
        def example(batch: list[list[tuple[bytes, bytes]]]) -> None:
            last = r.execute_command("XREVRANGE", keys.dlq, "+", "-", "COUNT", 1)
            last_id = last[0][0] if last else b""
            ran_before = sum(wt.ran.values())
            want: dict[bytes, str] = {}
            for pairs in batch:
                eid = r.execute_command("XADD", keys.stream, "*", *[x for kv in pairs for x in kv])
                want[eid] = expected_outcome(pairs)
            wait_until_sync(lambda: _settled(r, keys) or not wt.alive(), 30, what="the fuzz batch to settle")
            assert wt.alive(), wt.error
            dead = {f[b"source_id"]: f for f in _dlq_since(r, keys, last_id)}
            for eid, outcome in want.items():
                tally[outcome] += 1
                if outcome == "ran":
                    assert eid not in dead, (eid, dead.get(eid))
                else:
                    assert eid in dead, f"entry {eid!r} ({outcome}) is not in the DLQ"
                    assert dead[eid][b"reason"].decode() == outcome, (dead[eid], outcome)
            assert set(dead) <= set(want), "a DLQ entry for something never written"
            assert sum(wt.ran.values()) - ran_before == sum(1 for o in want.values() if o == "ran")

        example()
        _good_job(r, keys, wt)
    assert set(tally) >= {"ran", "decode_failed", "malformed", "unrecoverable"}, tally
    print(f"\n[fuzz stream entries] outcomes={dict(tally)}")


@pytest.mark.timeout(300)
def test_random_bytes_flood(redis_url: str, queue_name: str) -> None:
    """5,000 entries of plain random bytes (seeded) in fields, names and payloads."""
    keys = QueueKeys.for_queue(queue_name)
    rng = random.Random(0xC4A5)
    tally: collections.Counter[str] = collections.Counter()
    with worker_thread(redis_url, queue_name) as wt, _client(redis_url) as r:
        _ensure_group(r, keys)
        want: dict[bytes, str] = {}
        pipe = r.pipeline(transaction=False)
        batch: list[list[tuple[bytes, bytes]]] = []
        for k in range(5000):
            size = rng.choice((0, 1, 3, 17, 200, MAX_PAYLOAD + 1))
            body = rng.randbytes(size)
            pairs = [(b"d", body)] if k % 7 else [(rng.randbytes(2), body)]
            if k % 3 == 0:
                pairs.append((b"n", rng.randbytes(rng.randrange(0, 8))))
            batch.append(pairs)
            pipe.execute_command("XADD", keys.stream, "*", *[x for kv in pairs for x in kv])
        for eid, pairs in zip(pipe.execute(), batch):
            want[eid] = expected_outcome(pairs)
        wait_until_sync(lambda: _settled(r, keys) or not wt.alive(), 120, what="the flood to settle", interval=0.05)
        assert wt.alive(), wt.error
        dead = {f[b"source_id"]: f[b"reason"].decode() for f in _dlq_since(r, keys, b"")}
        for eid, outcome in want.items():
            tally[outcome] += 1
            assert outcome == "ran" or dead.get(eid) == outcome, (eid, outcome, dead.get(eid))
        _good_job(r, keys, wt)
    print(f"\n[fuzz random bytes] entries=5000 outcomes={dict(tally)}")


def _promoted_pairs(member: bytes) -> list[tuple[bytes, bytes]]:
    """What promote.lua turns a delayed member into (its contract, restated)."""
    if len(member) < 4:
        return [(b"d", member)]
    (n,) = struct.unpack_from("<I", member)
    name, env = member[4 : 4 + n], member[4 + n :]
    return [(b"d", env)] if n == 0 else [(b"d", env), (b"n", name)]


_members = st.one_of(
    st.binary(max_size=8),  # shorter than the 4-byte prefix, or a prefix running past the end
    st.tuples(_names, _payloads).map(lambda t: struct.pack("<I", len(t[0])) + t[0] + t[1]),
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=40)).map(lambda t: struct.pack("<I", t[0]) + t[1]),
)


@pytest.mark.timeout(300)
def test_fuzzed_delayed_members_never_stall_the_promoter(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    tally: collections.Counter[str] = collections.Counter()
    with worker_thread(redis_url, queue_name) as wt, _client(redis_url) as r:
        _ensure_group(r, keys)

        @settings(
            max_examples=120,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(_members, min_size=1, max_size=10, unique=True))
        def example(members: list[bytes]) -> None:
            last = r.execute_command("XREVRANGE", keys.dlq, "+", "-", "COUNT", 1)
            last_id = last[0][0] if last else b""
            ran_before = sum(wt.ran.values())
            # A good delayed job behind the hostile ones (same due time) must still run.
            good = struct.pack("<I", 2) + b"ok" + encode_envelope(Envelope(f"good-{next(_counter)}", _packb(1), 1, 0))
            r.execute_command("ZADD", keys.delayed, *[x for m in [*members, good] for x in (0, m)])
            wait_until_sync(lambda: _settled(r, keys) or not wt.alive(), 30, what="the delayed members to settle")
            assert wt.alive(), wt.error
            want = collections.Counter(expected_outcome(_promoted_pairs(m)) for m in members)
            got = collections.Counter(f[b"reason"].decode() for f in _dlq_since(r, keys, last_id))
            ran = sum(wt.ran.values()) - ran_before
            assert ran == want.pop("ran", 0) + 1, "the good job behind them did not run (or ran twice)"
            assert got == want
            tally.update(want)

        example()
        _good_job(r, keys, wt)
    print(f"\n[fuzz delayed members] dlq_reasons={dict(tally)}")
