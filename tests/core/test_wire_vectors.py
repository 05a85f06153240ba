"""Golden wire tests: what the sans-I/O core writes equals the spec's vectors byte for byte.

Vectors V1-V8 and V13 (wire spec section 23) plus the command shapes of V14.  No Redis here:
flows are driven by hand, so the exact command each step would send is compared.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
import wire_vectors
from engine_support import consumer_core
from wire_vectors import (
    CREATED_AT_MS,
    DATA,
    JOB_ID,
    LENGTHS,
    NAME,
    V1,
    V2,
    V3,
    V4,
    V5,
    V6,
    V7,
    V8,
    V13,
)

from airflow_provider_chasqui.core.codec import (
    BackoffWire,
    Envelope,
    RetryOverride,
    decode_data,
    decode_envelope,
    encode_data,
    encode_envelope,
    encode_member,
    split_member,
)
from airflow_provider_chasqui.core.consumer import ConsumerCore, Delivery
from airflow_provider_chasqui.core.features import COMPAT, Features
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.core.retry import RetryPolicy
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.errors import CodecError
from airflow_provider_chasqui.types import BackoffSpec, build_retry_override

NOW = CREATED_AT_MS


def test_vectors_have_the_lengths_the_spec_states() -> None:
    for name, length in LENGTHS.items():
        assert len(getattr(wire_vectors, name)) == length, name


# ---- V1-V6: inner data and envelopes -------------------------------------------------------


def test_v1_inner_user_data() -> None:
    assert encode_data(DATA) == V1
    assert decode_data(V1) == DATA


def test_v2_envelope_attempt_0_no_retry() -> None:
    assert encode_envelope(Envelope(JOB_ID, V1, CREATED_AT_MS, 0)) == V2
    env = decode_envelope(V2)
    assert env == Envelope(JOB_ID, V1, CREATED_AT_MS, 0, None)
    assert decode_data(env.inner) == DATA


def test_v3_envelope_after_two_failed_runs() -> None:
    assert encode_envelope(Envelope(JOB_ID, V1, CREATED_AT_MS, 2)) == V3
    assert decode_envelope(V3).attempt == 2
    assert decode_envelope(V2).with_attempt(2) == decode_envelope(V3)


@pytest.mark.parametrize(
    ("attempts", "backoff", "vector"),
    [
        (5, BackoffSpec.exponential(250, multiplier=3.0, max_ms=10_000, jitter_ms=50), V4),
        (None, 500, V5),  # the Python shim's backoff=<int>: fixed, other fields nil
        (3, None, V6),
    ],
    ids=["V4", "V5", "V6"],
)
def test_v4_v5_v6_retry_overrides(attempts, backoff, vector) -> None:
    core = ProducerCore("emails")
    job = core.prepare(NAME, DATA, retry=build_retry_override(attempts, backoff), job_id=JOB_ID, now=NOW)
    assert job.envelope == vector
    # and back: the override survives a decode/encode round trip unchanged
    assert encode_envelope(decode_envelope(vector)) == vector


def test_v4_decodes_to_the_override_fields() -> None:
    env = decode_envelope(V4)
    assert env.retry == RetryOverride(5, BackoffWire("exponential", 250, 10_000, 3.0, 50))
    assert decode_envelope(V5).retry == RetryOverride(None, BackoffWire("fixed", 500))
    assert decode_envelope(V6).retry == RetryOverride(3, None)


def test_v4_backoff_dict_form_encodes_the_same() -> None:
    backoff = {"kind": "exponential", "delay_ms": 250, "max_delay_ms": 10_000, "multiplier": 3.0, "jitter_ms": 50}
    job = ProducerCore("emails").prepare(NAME, DATA, retry=build_retry_override(5, backoff), job_id=JOB_ID, now=NOW)
    assert job.envelope == V4


def test_multiplier_is_float64_even_when_given_as_int() -> None:
    job = ProducerCore("emails").prepare(
        NAME,
        DATA,
        retry=build_retry_override(5, BackoffSpec("exponential", 250, 10_000, 3, 50)),
        job_id=JOB_ID,
        now=NOW,
    )
    assert job.envelope == V4  # 3 -> cb 40 08 00.. (float64), never an int or a float32


def test_inert_override_is_still_a_five_element_envelope() -> None:
    raw = encode_envelope(Envelope(JOB_ID, V1, CREATED_AT_MS, 0, RetryOverride(None, None)))
    assert raw == V2[:1].replace(b"\x94", b"\x95") + V2[1:] + b"\x92\xc0\xc0"


# ---- V7, V8: delayed members ----------------------------------------------------------------


def test_v7_delayed_member() -> None:
    assert encode_member(NAME.encode(), V2) == V7
    assert split_member(V7) == (NAME, V2)
    assert V7[:4] == struct.pack("<I", 10)


def test_v7_from_a_delayed_add() -> None:
    core = ProducerCore("emails")
    job = core.prepare(NAME, DATA, delay_ms=60_000, job_id=JOB_ID, now=NOW)
    assert job.run_at_ms == NOW + 60_000
    flow = core.add(job)
    call = next(flow)
    assert call.args == ("ZADD", "{chasqui:emails}:delayed", 1_700_000_060_000, V7)
    with pytest.raises(StopIteration) as stop:
        flow.send(1)
    assert stop.value.value == JOB_ID


def test_unnamed_member_starts_with_four_zero_bytes() -> None:
    assert encode_member(b"", V2) == b"\x00\x00\x00\x00" + V2
    assert split_member(b"\x00\x00\x00\x00" + V2) == ("", V2)


def test_split_member_rejects_short_or_truncated_members() -> None:
    with pytest.raises(CodecError):
        split_member(b"\x01\x00")
    with pytest.raises(CodecError):
        split_member(b"\x20\x00\x00\x00abc")


def _consumer(max_attempts: int = 3) -> ConsumerCore:
    return consumer_core("emails", max_attempts=max_attempts)


_FAIL_HEAD = ("default", "0", 100_000, 100_000, 0, "{chasqui:emails}", NOW, 10_000)


def test_v8_retry_member_after_the_first_failure() -> None:
    """The worker's retry: one ``fail_batch`` row (kind ``r``) whose member is V8, scheduled at
    now + backoff, with the ``failed`` / ``retry-scheduled`` event fields of spec V14."""
    core = _consumer()
    dl = core.gate(b"1700000000000-0", [b"d", V2, b"n", NAME.encode()], 1)
    assert isinstance(dl, Delivery) and dl.name == NAME and dl.payload() == DATA
    row, outcome, delay = core.failure_row(dl, ValueError("boom"), False, 511, NOW)
    assert outcome == "retry"
    assert 100 <= delay < 200  # backoff(1) with the defaults: 100 ms + [0, 100) jitter
    call = core.fail([row], COMPAT, NOW)
    assert call.script is not None and call.script.name == "fail_batch"
    assert call.keys == (
        "{chasqui:emails}:stream",
        "{chasqui:emails}:delayed",
        "{chasqui:emails}:dlq",
        "{chasqui:emails}:events",
    )
    assert call.argv[:8] == _FAIL_HEAD
    # kind, entry, job id, name, failed run 1 and the ChasquiMQ reason string, duration; then
    # run-at, the V8 member, next run 2, backoff, and no traceback (a retry's is logged only)
    assert call.argv[8:] == (
        "r",
        b"1700000000000-0",
        JOB_ID,
        NAME,
        1,
        "handler: Python handler raised: ValueError('boom')",
        511,
        NOW + delay,
        V8,
        2,
        delay,
        "",
    )


def test_v3_is_the_dlq_payload_of_the_last_allowed_run() -> None:
    """max_attempts 3: the failing run has attempt 2, ``d`` is V3 and the dlq event says 3."""
    core = _consumer(3)
    dl = core.gate(b"1700000005000-0", [b"d", V3, b"n", NAME.encode()], 1)
    assert isinstance(dl, Delivery)
    row, outcome, delay = core.failure_row(dl, ValueError("boom"), False, 7, NOW)
    assert (outcome, delay) == ("retries_exhausted", 0)
    call = core.fail([row], Features(xackdel=True), NOW)
    assert call.script.name == "fail_batch"
    assert call.argv[:8] == ("default", "1", *_FAIL_HEAD[2:])
    kind, entry_id, job_id, name, attempt, failed_reason, duration_us, payload, reason, detail, dlq_name, tb = (
        call.argv[8:]
    )
    assert (kind, entry_id, job_id, name, attempt) == ("d", b"1700000005000-0", JOB_ID, NAME, 3)
    assert payload == V3
    assert (reason, detail, dlq_name) == ("retries_exhausted", "", "")
    assert failed_reason == "handler: Python handler raised: ValueError('boom')"
    assert duration_us == 7
    # an exception that was never raised has no traceback: the DLQ entry keeps ChasquiMQ's
    # exact shape (no `detail`); a raised one's traceback is the subject of test_engine_worker
    assert tb == ""


# ---- V13: a native typed payload is not shim-compatible ----------------------------------------


def test_v13_inline_typed_payload_is_a_decode_error() -> None:
    with pytest.raises(CodecError):
        decode_envelope(V13)
    verdict = _consumer().gate(b"1-0", [b"d", V13, b"n", b"send-email"], 1)
    assert verdict.reason == "decode_failed"
    assert verdict.payload == V13
    assert verdict.name == ""  # decode_failed names no job in its events (spec 7.2) ...
    assert verdict.dlq_name == b"send-email"  # ... but its DLQ entry keeps the original `n` bytes


def test_v13_layout_is_what_the_spec_says() -> None:
    arr = msgpack.unpackb(V13, raw=False)
    assert arr == [JOB_ID, ["ada@example.com", "hi"], CREATED_AT_MS, 0]


# ---- V14: command-level shapes -------------------------------------------------------------


def test_v14_immediate_named_add_command() -> None:
    """Our immediate add is ChasquiMQ's XADD without IDMP (Redis 7 has none), same fields."""
    core = ProducerCore("emails")
    job = core.prepare(NAME, DATA, job_id=None, now=NOW)
    call = next(core.add(job))
    assert call.args[:6] == ("XADD", "{chasqui:emails}:stream", "MAXLEN", "~", 1_000_000, "*")
    assert call.args[6] == "d" and call.args[8:] == ("n", b"send-email")
    env = decode_envelope(call.args[7])
    assert (env.inner, env.created_at_ms, env.attempt, env.retry) == (V1, NOW, 0, None)


def test_v14_unnamed_add_has_no_n_field() -> None:
    core = ProducerCore("emails")
    call = next(core.add(core.prepare("", DATA, now=NOW)))
    assert len(call.args) == 8 and call.args[6] == "d"


def test_v14_idempotent_delayed_add() -> None:
    core = ProducerCore("emails")
    job = core.prepare(NAME, DATA, delay_ms=60_000, job_id=JOB_ID, now=NOW)
    call = next(core.add_with_id(job))
    assert call.script.name == "schedule_delayed_idempotent"
    assert call.keys == (
        f"{{chasqui:emails}}:dlid:{JOB_ID}",
        "{chasqui:emails}:delayed",
        f"{{chasqui:emails}}:didx:{JOB_ID}",
    )
    assert call.argv == (3660, 1_700_000_060_000, V7)


def test_v14_idempotent_ttl_is_at_least_one_second_plus_an_hour() -> None:
    core = ProducerCore("emails")
    job = core.prepare(NAME, DATA, delay_ms=300, job_id=JOB_ID, now=NOW)
    assert next(core.add_with_id(job)).argv[0] == 3601


def test_v14_consumer_read_and_group_commands() -> None:
    core = _consumer()
    assert core.create_group().args == ("XGROUP", "CREATE", "{chasqui:emails}:stream", "default", "0", "MKSTREAM")
    assert core.read(64, 5000).args == (
        "XREADGROUP",
        "GROUP",
        "default",
        "c-test",
        "COUNT",
        64,
        "BLOCK",
        5000,
        "STREAMS",
        "{chasqui:emails}:stream",
        ">",
    )
    assert core.idle_pending(30_000, 64).args == (
        "XPENDING",
        "{chasqui:emails}:stream",
        "default",
        "IDLE",
        30_000,
        "-",
        "+",
        64,
    )


def test_v14_active_event_fields() -> None:
    """The worker's ``active`` events, in ``emit_events``' compact form: id, name ("" = no
    ``n`` field) and 1-indexed attempt per job (the Lua side is test_lua_scripts')."""
    core = _consumer()
    dl = core.gate(b"1-0", [b"d", V2, b"n", NAME.encode()], 1)
    unnamed = core.gate(b"1-1", [b"d", V2], 1)
    call = core.active_events_compact([dl, unnamed], 1_700_000_000_105)
    assert call.script.name == "emit_events"
    assert call.keys == ("{chasqui:emails}:events",)
    assert call.argv == (100_000, 0, "active", 1_700_000_000_105, JOB_ID, NAME, 1, JOB_ID, "", 1)


def test_drained_event_has_an_empty_id_and_no_name() -> None:
    call = _consumer().drained_event(5)
    assert call.argv == (100_000, 3, "e", "drained", "id", "", "ts", 5)


def test_events_disabled_writes_nothing_and_passes_zero() -> None:
    core = ConsumerCore(
        "emails",
        group="default",
        consumer_id="c",
        max_attempts=3,
        settings=QueueSettings(),
        retry=RetryPolicy(),
        events=False,
        result_ttl_ms=0,
        failure_ttl_ms=0,
    )
    dl = core.gate(b"1-0", [b"d", V2], 1)
    assert core.active_events_compact([dl], 1) is None
    assert core.drained_event(1) is None
    assert core.complete([(b"1-0", JOB_ID, "", 1, 5, b"")], COMPAT, 1).argv[2] == 0
