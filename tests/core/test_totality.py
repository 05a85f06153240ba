"""Decoding and retry maths are total (issue #12): a bad number in an envelope, a retry override
or a spec's ``ext`` is ``decode_failed`` at the arrival gate, naming the field, and never an
exception later (``backoff_ms`` in the worker's failure path); reasons and names are bounded."""

from __future__ import annotations

import math
import random

import msgpack
import pytest
from engine_support import consumer_core
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui.core.codec import (
    MAX_JOB_ID_CHARS,
    MAX_JOB_NAME_BYTES,
    BackoffWire,
    Envelope,
    RetryOverride,
    decode_data,
    decode_envelope,
    encode_envelope,
)
from airflow_provider_chasqui.core.consumer import (
    ConsumerCore,
    Delivery,
    Rejected,
)
from airflow_provider_chasqui.core.failure import MAX_REASON_BYTES, clip_text, handler_failure_reason
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.core.retry import MAX_BACKOFF_MS, RetryPolicy, backoff_ms
from airflow_provider_chasqui.core.spec_ext import SpecExt
from airflow_provider_chasqui.errors import CodecError, ConfigError

NOW = 1_700_000_000_000
BAD_MULTIPLIERS = [math.nan, math.inf, -math.inf, -1.0, -1e-300]


def _core(max_attempts: int = 25) -> ConsumerCore:
    return consumer_core("totality", max_attempts=max_attempts, group="g", consumer_id="c", failure_ttl_ms=1000)


def _envelope(retry: object, job_id: str = "J1") -> bytes:
    return msgpack.packb([job_id, msgpack.packb({"x": 1}), NOW, 0, retry], use_bin_type=True)


# ---- the issue's reproduction: a NaN / infinite multiplier -------------------------------------


@pytest.mark.parametrize("mult", BAD_MULTIPLIERS)
def test_bad_multiplier_is_decode_failed_naming_the_field(mult: float) -> None:
    raw = _envelope([5, ["exponential", 100, None, mult, None]])
    with pytest.raises(CodecError, match="multiplier"):
        decode_envelope(raw)
    core = _core()
    ready, rejected = core.gate_fresh([(b"1-0", [b"d", raw, b"n", b"mail"])])
    assert ready == [] and [r.reason for r in rejected] == ["decode_failed"]
    assert "multiplier" in rejected[0].detail
    row = core.reject_row(rejected[0])
    assert row[7] == raw and row[8] == "decode_failed" and "multiplier" in row[9]
    assert row[10] == b"mail"  # the DLQ entry keeps the original name


@pytest.mark.parametrize("mult", BAD_MULTIPLIERS)
def test_bad_multiplier_in_the_map_form_is_refused_too(mult: float) -> None:
    retry = {"max_attempts": 5, "backoff": {"kind": "exponential", "delay_ms": 100, "multiplier": mult}}
    with pytest.raises(CodecError, match="multiplier"):
        decode_envelope(_envelope(retry))


@pytest.mark.parametrize("mult", BAD_MULTIPLIERS)
def test_spec_ext_with_a_bad_multiplier_does_not_decode(mult: float) -> None:
    """The ext carries its override to every fire: it must not decode (the scheduler moves the
    spec aside) rather than hand each fire an override that breaks the failure path."""
    ext = msgpack.packb([1, [3, ["exponential", 100, None, mult, None]], None], use_bin_type=True)
    with pytest.raises(CodecError, match="multiplier"):
        SpecExt.decode(ext)


def test_the_scheduler_moves_a_spec_with_a_bad_ext_aside_instead_of_firing_it() -> None:
    """The ext's override would reach every fire: the spec is quarantined, the reason naming
    the multiplier, and the good spec in the same batch still fires."""
    from airflow_provider_chasqui.core.repeat import RepeatPattern, StoredSpec
    from airflow_provider_chasqui.core.scheduler import SchedulerCore

    core = SchedulerCore("totality")
    spec = StoredSpec("k", "job", RepeatPattern.every(1000), msgpack.packb(1)).encode()
    bad_ext = msgpack.packb([1, [3, ["exponential", 100, None, math.nan, None]], None], use_bin_type=True)
    good_ext = msgpack.packb([1, [3, ["exponential", 100, None, 2.0, None]], None], use_bin_type=True)
    call, plans, *_ = core._plan([(b"bad", b"1000", spec, bad_ext), (b"good", b"1000", spec, good_ext)], 0, NOW, {})
    (op_bad, key_bad, *_r, why), (op_good, key_good, *_rest) = plans
    assert (op_bad, key_bad) == ("Q", "bad") and "multiplier" in why
    assert (op_good, key_good) != ("Q", "good") and call.script.name == "schedule_batch"


def test_finite_multipliers_still_decode_as_before() -> None:
    for mult in (0.0, 0.5, 2, 2.0, 1e308, 2**64 - 1):
        env = decode_envelope(_envelope([None, ["exponential", 100, None, mult, None]]))
        assert env.retry.backoff.multiplier == float(mult)


@pytest.mark.parametrize("value", [True, 1.5, -1, -(2**63), "10", None])
def test_every_integer_field_of_an_override_is_checked(value: object) -> None:
    for slot in (1, 2, 4):  # delay_ms, max_delay_ms, jitter_ms
        backoff: list[object] = ["fixed", 100, None, None, None]
        backoff[slot] = value
        if value is None and slot != 1:
            continue  # nil is allowed for the optional ones
        with pytest.raises(CodecError):
            decode_envelope(_envelope([None, backoff]))
    with pytest.raises(CodecError):
        decode_envelope(_envelope([value if value is not None else "x", None]))


def test_retry_policy_refuses_non_finite_values() -> None:
    for bad in (
        {"multiplier": math.nan},
        {"multiplier": math.inf},
        {"multiplier": -2.0},
        {"max_ms": -1},
        {"initial_ms": True},
        {"jitter_ms": 1.5},
        {"max_ms": 2**60},
    ):
        with pytest.raises(ConfigError):
            RetryPolicy(**bad)


# ---- backoff_ms is total -------------------------------------------------------------------------

_ints = st.one_of(st.integers(), st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, 2**64 - 1]))
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 2.0, 1e308]))


@settings(max_examples=500, deadline=None)
@given(
    n=_ints,
    kind=st.sampled_from(["fixed", "exponential", "weird", ""]),
    delay=_ints,
    cap=st.one_of(st.none(), _ints),
    mult=st.one_of(st.none(), _floats),
    jitter=st.one_of(st.none(), _ints),
    seed=st.integers(0, 2**32),
)
def test_backoff_ms_never_raises_and_stays_in_range(n, kind, delay, cap, mult, jitter, seed) -> None:
    spec = BackoffWire(kind, delay, cap, mult, jitter)
    policy = RetryPolicy()
    got = backoff_ms(n, spec, policy, random.Random(seed))
    assert type(got) is int and 0 <= got <= MAX_BACKOFF_MS
    eff_cap = max(0, policy.max_ms if cap is None else cap)
    eff_jitter = max(0, policy.jitter_ms if jitter is None else jitter)
    assert got <= min(eff_cap, MAX_BACKOFF_MS) + eff_jitter


@pytest.mark.parametrize(
    "n, spec, want",
    [
        (1, BackoffWire("exponential", 100, None, math.nan, 0), 100),  # nan ** 0 = 1 on the first retry
        (2, BackoffWire("exponential", 100, None, math.nan, 0), 30_000),  # then NaN: the cap, as Rust's f64::min
        (5, BackoffWire("exponential", 100, 0, 2.0, 0), 0),  # max 0
        (10**9, BackoffWire("exponential", 2**64 - 1, None, 1e308, 0), 30_000),  # huge everything: the cap
        (10**9, BackoffWire("exponential", 100, 2**64 - 1, 1e308, 0), MAX_BACKOFF_MS),
        (2**2000, BackoffWire("exponential", 100, None, 2.0, 0), 30_000),  # an exponent past any float
        (2, BackoffWire("exponential", 100, None, -3.0, -5), 0),  # negative multiplier and jitter
        (1, BackoffWire("fixed", -5, None, None, 0), 0),
        (1, BackoffWire("exponential", 2**64 - 1, 2**64 - 1, None, 2**64 - 1), MAX_BACKOFF_MS),
    ],
)
def test_backoff_edge_cases(n: int, spec: BackoffWire, want: int) -> None:
    assert backoff_ms(n, spec, RetryPolicy()) == want


# ---- arbitrary envelopes: decode is total, and so is the failure path after it ----------------------

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=8), st.binary(max_size=8)
)
_backoff = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=6),
    st.tuples(st.sampled_from(["fixed", "exponential", "x"]), _scalar, _scalar, _scalar, _scalar).map(list),
    st.tuples(
        st.sampled_from(["fixed", "exponential"]),
        st.integers(0, 2**64 - 1),
        st.one_of(st.none(), st.integers(0, 2**64 - 1)),
        st.one_of(st.none(), st.floats()),
        st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    ).map(list),
)
_retry = st.one_of(
    _scalar,
    st.tuples(st.one_of(st.none(), st.integers(-1, 2**33), _scalar), _backoff).map(list),
    st.dictionaries(st.sampled_from(["max_attempts", "backoff", "x"]), st.one_of(_scalar, _backoff)),
)
_envelopes = st.one_of(
    st.tuples(
        st.text(max_size=30), st.just(msgpack.packb(1)), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), _retry
    ).map(list),
    st.tuples(_scalar, _scalar, _scalar, _scalar, _retry).map(list),
    st.lists(_scalar, max_size=6),
    st.dictionaries(
        st.sampled_from(["id", "payload", "created_at_ms", "attempt", "retry"]), st.one_of(_scalar, _retry)
    ),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arr=_envelopes, delivery_count=st.integers(1, 2**33), seed=st.integers(0, 2**32))
@example(arr=["", b"", 0], delivery_count=1, seed=0)  # empty data: the gate admits it, its start refuses it
def test_arbitrary_envelopes_decode_or_are_decode_failed_and_never_break_the_failure_path(
    arr, delivery_count, seed
) -> None:
    raw = msgpack.packb(arr, use_bin_type=True)
    try:
        env = decode_envelope(raw)  # the gate reads the envelope only; data waits for the job's start
    except CodecError:
        env = None
    core = _core()
    core.rng.seed(seed)
    verdict = core.gate(b"1-0", [b"d", raw, b"n", b"job"], delivery_count)
    if env is None:
        assert isinstance(verdict, Rejected) and verdict.reason == "decode_failed"
        assert core.reject_row(verdict)[9]  # a detail that says what failed
        return
    # what decoded is in range, so everything after it is arithmetic on sane numbers
    assert 0 <= env.attempt <= 2**32 - 1 and 0 <= env.created_at_ms <= 2**64 - 1
    if env.retry is not None and env.retry.backoff is not None:
        b = env.retry.backoff
        assert b.multiplier is None or (math.isfinite(b.multiplier) and b.multiplier >= 0)
    if isinstance(verdict, Rejected):
        assert verdict.reason == "retries_exhausted"
        return
    assert isinstance(verdict, Delivery)
    try:
        verdict.payload()
    except CodecError as exc:  # at its start the worker dead-letters it, naming what failed
        row = core.reject_row(core.undecodable(verdict, exc))
        assert row[8] == "decode_failed" and row[9] and row[2] == env.id and row[7] == raw
        with pytest.raises(CodecError):
            decode_data(env.inner)  # the codec's own verdict
        return
    for unrecoverable in (False, True):
        row, outcome, delay = core.failure_row(verdict, ValueError("x" * 10_000), unrecoverable, 5, NOW)
        assert outcome in ("retry", "retries_exhausted", "unrecoverable")
        assert len(row[5].encode()) <= MAX_REASON_BYTES
        if outcome == "retry":
            assert 0 <= delay <= MAX_BACKOFF_MS and row[7] == NOW + delay
            assert decode_envelope(row[8][4 + 3 :]).attempt == env.attempt + 1  # the member re-decodes
            assert env.attempt + 1 <= 2**32 - 1


# ---- bounded bytes: names, ids, unique keys, reasons ---------------------------------------------


def test_a_foreign_name_over_the_limit_is_decode_failed_and_kept_whole_in_the_dlq() -> None:
    name = b"n" * (MAX_JOB_NAME_BYTES + 1)
    raw = encode_envelope(Envelope("J1", msgpack.packb(1), NOW))
    core = _core()
    ready, rejected = core.gate_fresh([(b"1-0", [b"d", raw, b"n", name])])
    assert ready == [] and rejected[0].reason == "decode_failed" and "job name" in rejected[0].detail
    assert rejected[0].name == ""  # events name nothing this long
    row = core.reject_row(rejected[0])
    assert row[3] == "" and row[10] == name and row[7] == raw
    ok = core.gate_fresh([(b"1-1", [b"d", raw, b"n", b"n" * MAX_JOB_NAME_BYTES])])[0]
    assert len(ok) == 1


def test_a_non_utf8_name_keeps_its_bytes_in_the_dlq() -> None:
    core = _core()
    verdict = core.gate(b"1-0", [b"d", b"\xc1", b"n", b"\xff\xfe"], 1)
    assert isinstance(verdict, Rejected) and core.reject_row(verdict)[10] == b"\xff\xfe"


def test_a_delivery_with_a_non_utf8_name_keeps_its_bytes_through_retry_and_dlq() -> None:
    """Handlers get a str; the retry member and the DLQ row carry the original bytes (and the
    DLQ row the entry's original payload)."""
    core = _core(max_attempts=2)
    raw = _envelope(None)  # 5 elements: re-encoding would drop the nil retry
    (dl,), rejected = core.gate_fresh([(b"1-0", [b"d", raw, b"n", b"\xff\xfeok"])])
    assert rejected == [] and dl.name == "\ufffd\ufffdok" and dl.raw_name == b"\xff\xfeok"
    row, outcome, _ = core.failure_row(dl, ValueError("x"), False, 1, NOW)
    assert outcome == "retry" and row[8][:8] == (4).to_bytes(4, "little") + b"\xff\xfeok"
    row, outcome, _ = core.failure_row(dl, ValueError("x"), True, 1, NOW)
    assert outcome == "unrecoverable" and row[3] == dl.name and (row[7], row[10]) == (raw, b"\xff\xfeok")
    (ok,), _ = core.gate_fresh([(b"1-1", [b"d", raw, b"n", b"ok"])])
    assert ok.raw_name == b"" and core.failure_row(ok, ValueError("x"), True, 1, NOW)[0][10] == ""


def test_a_foreign_job_id_over_the_limit_is_decode_failed() -> None:
    raw = encode_envelope(Envelope("i" * (MAX_JOB_ID_CHARS + 1), msgpack.packb(1), NOW))
    with pytest.raises(CodecError, match="id"):
        decode_envelope(raw)
    ready, rejected = _core().gate_fresh([(b"1-0", [b"d", raw, b"n", b"x"])])
    assert ready == [] and rejected[0].reason == "decode_failed"
    assert decode_envelope(encode_envelope(Envelope("i" * MAX_JOB_ID_CHARS, b"\x01", NOW))).id == "i" * MAX_JOB_ID_CHARS


def test_unique_keys_are_capped_on_the_producer_side() -> None:
    core = ProducerCore("totality")
    job = core.prepare("x", {})
    with pytest.raises(ConfigError, match="unique key is 1025 characters"):
        next(core.add_unique(job, "k" * 1025, 1000))
    assert next(core.add_unique(job, "k" * 1024, 1000)).script.name == "add_unique"


class _HugeRepr(Exception):
    def __repr__(self) -> str:
        return "é" * 1_000_000


class _BrokenRepr(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _SurrogateRepr(Exception):
    def __repr__(self) -> str:
        return "bad \udc80 char"


def test_failure_reasons_are_bounded_and_always_encodable() -> None:
    huge = handler_failure_reason(_HugeRepr())
    assert len(huge.encode()) <= MAX_REASON_BYTES and huge.endswith("[truncated: 2000032 bytes]")
    assert huge.startswith("handler: Python handler raised: éé")
    assert "repr() failed" in handler_failure_reason(_BrokenRepr())
    assert handler_failure_reason(_SurrogateRepr()).encode()  # no UnicodeEncodeError at send time
    assert handler_failure_reason(ValueError("boom")) == "handler: Python handler raised: ValueError('boom')"
    assert clip_text("a" * MAX_REASON_BYTES) == "a" * MAX_REASON_BYTES


def test_the_failure_path_takes_a_bad_override_built_in_process() -> None:
    """Second line of defence: an override that never went through the decoder."""
    core = _core()
    env = Envelope("J1", b"\x01", NOW, 0, RetryOverride(None, BackoffWire("exponential", 100, None, math.nan, None)))
    dl = Delivery(b"1-0", env, "mail", encode_envelope(env))
    row, outcome, delay = core.failure_row(dl, _HugeRepr(), False, 1, NOW)
    assert outcome == "retry" and 0 <= delay <= 30_000 + 100


@settings(max_examples=200, deadline=None)
@given(max_attempts=st.integers(0, 2**70), attempt=st.integers(0, 2**32 - 1))
def test_attempts_never_overflow_u32(max_attempts: int, attempt: int) -> None:
    core = _core(max_attempts)
    env = Envelope("J1", b"\x01", NOW, attempt)
    dl = Delivery(b"1-0", env, "mail", encode_envelope(env))
    row, outcome, _ = core.failure_row(dl, ValueError("x"), False, 1, NOW)
    if outcome == "retry":
        assert decode_envelope(row[8][8:]).attempt == attempt + 1


# ---- the memoised retry override (issue 27: the worker's hot path) ----------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["fixed", "exponential", "linear", ""]),
    st.binary(max_size=3),
)
_OVERRIDES = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=3),
    st.tuples(_SCALARS, st.one_of(st.none(), st.lists(_SCALARS, min_size=5, max_size=5))).map(list),
    st.tuples(
        st.one_of(st.none(), st.integers(0, 5), st.booleans(), st.just(2.0)),
        st.tuples(
            st.sampled_from(["fixed", "exponential"]),
            st.one_of(st.integers(0, 3), st.just(1.0), st.just(True)),
            st.one_of(st.none(), st.integers(0, 3), st.just(0.0)),
            st.one_of(st.none(), st.integers(0, 3), st.floats(allow_nan=True), st.just(False)),
            st.one_of(st.none(), st.integers(0, 3), st.lists(st.integers(-5, 5), max_size=1)),
        ).map(list),
    ).map(list),
)


def _verdict(fn, raw):
    try:
        return fn(raw)
    except CodecError as exc:
        return ("CodecError", str(exc))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_OVERRIDES, min_size=1, max_size=8))
def test_the_retry_memo_answers_what_a_fresh_decode_answers(overrides: list[object]) -> None:
    """Whatever came first (``True`` where ``1`` was remembered, ``1.0`` where ``1`` was, a NaN,
    an unhashable list inside), the memoised decode gives the verdict of a fresh one."""
    from airflow_provider_chasqui.core.codec import _decode_retry, decode_retry

    for raw in overrides + overrides:  # the second pass answers from the memo
        assert _verdict(decode_retry, raw) == _verdict(_decode_retry, raw), raw


def test_the_retry_memo_tells_types_apart_and_stays_bounded() -> None:
    from airflow_provider_chasqui.core import codec

    good = [2, ["fixed", 0, None, None, None]]
    assert codec.decode_retry(good) == RetryOverride(2, BackoffWire("fixed", 0))
    for twin in ([True, ["fixed", 0, None, None, None]], [2, ["fixed", 0.0, None, None, None]], [2.0, None]):
        with pytest.raises(CodecError):
            codec.decode_retry(twin)
    for i in range(3 * codec._RETRY_MEMO_MAX):  # a producer sending ever new overrides
        codec.decode_retry([i, None])
        assert len(codec._RETRY_MEMO) <= codec._RETRY_MEMO_MAX
    assert codec.decode_retry(good) == RetryOverride(2, BackoffWire("fixed", 0))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OVERRIDES, st.integers(min_value=0, max_value=6), st.integers(min_value=1, max_value=6))
def test_the_arrival_loop_and_the_gate_agree_on_overrides(retry: object, attempt: int, queue_max: int) -> None:
    """``gate_fresh`` decodes a 5-element envelope inline; ``gate`` is the reference: the same
    job (with the override's or the queue's attempt limit), or the same refusal."""
    core = _core(max_attempts=queue_max)
    raw = msgpack.packb(["J1", msgpack.packb({"x": 1}), NOW, attempt, retry], use_bin_type=True)
    fields = [b"d", raw, b"n", b"mail"]
    ready, rejected = core.gate_fresh([(b"1-0", fields)])
    reference = core.gate(b"1-0", fields, 1)
    if isinstance(reference, Rejected):
        assert ready == [] and rejected == [reference]
    else:
        assert rejected == [] and len(ready) == 1
        assert ready[0].envelope == reference.envelope and ready[0].name == reference.name
        assert ready[0].payload() == {"x": 1}
