"""Envelope decoding rules of wire spec 4.4: what a ChasquiMQ worker accepts, we accept, and
what it rejects (routing the entry to the DLQ as ``decode_failed``), we reject."""

from __future__ import annotations

import json

import msgpack
import pytest
from wire_vectors import CREATED_AT_MS, JOB_ID, V1, V2

from airflow_provider_chasqui.core.codec import (
    MAX_JOB_NAME_BYTES,
    BackoffWire,
    Envelope,
    RetryOverride,
    data_json,
    decode_data,
    decode_envelope,
    encode_data,
    encode_envelope,
    new_job_id,
    validate_job_name,
)
from airflow_provider_chasqui.errors import CodecError, ConfigError

CROCKFORD = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_three_element_envelope_decodes_with_attempt_zero() -> None:
    env = decode_envelope(pack([JOB_ID, V1, CREATED_AT_MS]))
    assert env == Envelope(JOB_ID, V1, CREATED_AT_MS, 0, None)
    assert encode_envelope(env) == V2  # re-encoded in the canonical 4-element form


def test_payload_as_array_of_u8_is_accepted() -> None:
    env = decode_envelope(pack([JOB_ID, list(V1), CREATED_AT_MS, 0]))
    assert env.inner == V1


def test_empty_array_payload_is_empty_bytes() -> None:
    assert decode_envelope(pack([JOB_ID, [], CREATED_AT_MS, 0])).inner == b""


@pytest.mark.parametrize(
    "payload",
    [
        "a str",  # msgpack str in the RawBytes slot
        {"to": "x"},  # a map
        [1, 2, 256],  # not all u8
        [1, -1],
        [1.0],
        [True, False],  # msgpack booleans are not u8
        None,
        7,
    ],
    ids=["str", "map", "int-over-255", "negative", "float", "bool", "nil", "int"],
)
def test_payload_of_another_type_is_rejected(payload) -> None:
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, payload, CREATED_AT_MS, 0]))


def test_extra_trailing_element_is_rejected() -> None:
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, V1, CREATED_AT_MS, 0, None, "extra"]))
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, V1, CREATED_AT_MS, 0, [3, None], 1]))


@pytest.mark.parametrize("arr", [[], [JOB_ID], [JOB_ID, V1]], ids=["0", "1", "2"])
def test_too_few_elements_are_rejected(arr) -> None:
    with pytest.raises(CodecError):
        decode_envelope(pack(arr))


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"\x94\xba", pack("not an array"), pack(5), pack(None), b"\x92\x01\x02\x03"],
    ids=["empty", "reserved-byte", "truncated", "str", "int", "nil", "trailing-bytes"],
)
def test_not_an_envelope_at_all(raw) -> None:
    with pytest.raises(CodecError):
        decode_envelope(raw)


def test_id_must_be_a_str() -> None:
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID.encode(), V1, CREATED_AT_MS, 0]))
    with pytest.raises(CodecError):
        decode_envelope(pack([42, V1, CREATED_AT_MS, 0]))
    # any string works: no ULID validation (the Python tests use uuid4().hex)
    assert decode_envelope(pack(["x", V1, CREATED_AT_MS, 0])).id == "x"


def test_nil_where_an_integer_is_required_is_rejected() -> None:
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, V1, None, 0]))
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, V1, CREATED_AT_MS, None]))


def test_any_integer_width_is_accepted() -> None:
    # attempt 2 as uint32 (ce), created_at as uint64 (cf) even when it would fit smaller
    raw = b"\x94" + pack(JOB_ID) + pack(V1) + b"\xcf" + (5).to_bytes(8, "big") + b"\xce\x00\x00\x00\x02"
    env = decode_envelope(raw)
    assert (env.created_at_ms, env.attempt) == (5, 2)


@pytest.mark.parametrize(
    ("created", "attempt"),
    [(-1, 0), (CREATED_AT_MS, -1), (CREATED_AT_MS, 2**32), (2**64, 0), (CREATED_AT_MS, 1.0), (CREATED_AT_MS, True)],
    ids=["negative-created", "negative-attempt", "attempt-over-u32", "created-over-u64", "float-attempt", "bool"],
)
def test_integers_must_fit_the_rust_types(created, attempt) -> None:
    if created == 2**64:
        raw = b"\x94" + pack(JOB_ID) + pack(V1) + b"\xcf" + b"\xff" * 8 + b"\x00"
        # 2**64-1 is the largest u64 and is fine; anything msgpack cannot even hold is not testable
        assert decode_envelope(raw).created_at_ms == 2**64 - 1
        return
    with pytest.raises(CodecError):
        decode_envelope(pack([JOB_ID, V1, created, attempt]))


def test_attempt_u32_max_is_fine() -> None:
    assert decode_envelope(pack([JOB_ID, V1, CREATED_AT_MS, 2**32 - 1])).attempt == 2**32 - 1


def test_map_form_envelope_is_accepted() -> None:
    """serde structs also decode from a map keyed by field name (spec 4.4)."""
    raw = pack(
        {
            "id": JOB_ID,
            "payload": V1,
            "created_at_ms": CREATED_AT_MS,
            "attempt": 2,
            "retry": {"max_attempts": 4, "backoff": None},
        }
    )
    assert decode_envelope(raw) == Envelope(JOB_ID, V1, CREATED_AT_MS, 2, RetryOverride(4, None))
    # default fields may be missing in the map form too
    assert decode_envelope(pack({"id": JOB_ID, "payload": V1, "created_at_ms": 1})).attempt == 0
    with pytest.raises(CodecError):
        decode_envelope(pack({"id": JOB_ID, "payload": V1}))  # created_at_ms is required
    with pytest.raises(CodecError):  # present but nil is not "missing"
        decode_envelope(pack({"id": JOB_ID, "payload": V1, "created_at_ms": 1, "attempt": None}))


# ---- retry override shapes (spec 4.3) ------------------------------------------------------------


def _with_retry(retry) -> bytes:
    return pack([JOB_ID, V1, CREATED_AT_MS, 0, retry])


def test_retry_nil_is_no_override() -> None:
    assert decode_envelope(_with_retry(None)).retry is None


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        ([None, None], RetryOverride(None, None)),
        ([5, None], RetryOverride(5, None)),
        ([None, ["fixed", 500, None, None, None]], RetryOverride(None, BackoffWire("fixed", 500))),
        (
            [5, ["exponential", 250, 10_000, 3.0, 50]],
            RetryOverride(5, BackoffWire("exponential", 250, 10_000, 3.0, 50)),
        ),
        # unknown kinds decode (serde(other)) and are treated as exponential by the consumer
        ([None, ["linear", 10, None, None, None]], RetryOverride(None, BackoffWire("linear", 10))),
    ],
    ids=["inert", "attempts-only", "fixed", "exponential", "unknown-kind"],
)
def test_valid_retry_overrides(retry, expected) -> None:
    assert decode_envelope(_with_retry(retry)).retry == expected


@pytest.mark.parametrize(
    "retry",
    [
        [5],  # JobRetryOverride is exactly 2 elements
        [5, None, None],
        [],
        "x",
        [-1, None],
        [None, ["fixed", 500, None, None, None, None]],  # BackoffSpec is exactly 5 elements
        [None, ["fixed", 500, None, None]],
        [None, ["fixed"]],
        [None, [1, 500, None, None, None]],  # kind must be a string
        [None, ["fixed", None, None, None, None]],  # delay_ms is required
        [None, ["fixed", -5, None, None, None]],
        [None, ["fixed", 5, None, "2.0", None]],  # multiplier must be a float
        [None, ["fixed", 5, None, None, -1]],
    ],
    ids=[
        "1-elem",
        "3-elem",
        "empty",
        "str",
        "negative-attempts",
        "backoff-6",
        "backoff-4",
        "backoff-1",
        "kind-int",
        "delay-nil",
        "delay-negative",
        "multiplier-str",
        "jitter-negative",
    ],
)
def test_invalid_retry_overrides_are_rejected(retry) -> None:
    with pytest.raises(CodecError):
        decode_envelope(_with_retry(retry))


def test_integer_multiplier_decodes_as_float() -> None:
    retry = decode_envelope(_with_retry([None, ["exponential", 5, None, 2, None]])).retry
    assert retry.backoff.multiplier == 2.0 and isinstance(retry.backoff.multiplier, float)


# ---- ids and names ---------------------------------------------------------------------------


def test_new_job_id_is_a_canonical_ulid() -> None:
    jid = new_job_id(CREATED_AT_MS)
    assert len(jid) == 26 and set(jid) <= CROCKFORD
    value = 0
    for ch in jid:
        value = value * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(ch)
    assert value >> 80 == CREATED_AT_MS
    assert new_job_id() != new_job_id()


def test_job_name_limit_counts_utf8_bytes() -> None:
    assert validate_job_name("a" * MAX_JOB_NAME_BYTES) == b"a" * 256
    assert validate_job_name("é" * 128) == "é".encode() * 128  # exactly 256 bytes
    with pytest.raises(ConfigError):
        validate_job_name("a" * 257)
    with pytest.raises(ConfigError):
        validate_job_name("é" * 129)  # 129 characters, 258 bytes
    with pytest.raises(ConfigError):
        validate_job_name(b"bytes")


def test_array_map_keys_decode_as_tuple_keys_and_show_as_json() -> None:
    """A tuple-keyed dict packs to a map with array keys; the first decode's ``unhashable type:
    'list'`` made such a job undecodable (dead-lettered) and such a result unreadable."""
    value = {(1, (2, 3)): {"a": [1]}, "k": 2}
    raw = encode_data(value)
    assert decode_data(raw) == value
    big = {(i, "x"): "y" * 10 for i in range(8_000)}  # past SMALL_DATA_BYTES: the bounded decode
    assert decode_data(encode_data(big)) == big
    with pytest.raises(CodecError, match="not valid msgpack"):
        decode_data(b"\x81\x81\x01\x02\x03")  # a map key that is a map: no Python form
    assert json.loads(data_json(decode_data(raw), default=str)) == {"(1, (2, 3))": {"a": [1]}, "k": 2}
    assert data_json({"plain": [1.5, None]}) == '{"plain": [1.5, null]}'
