"""StoredSpec wire codec (spec §8.3, vectors V9-V12), key derivation (§8.2), value types
and missed-fire planning (§15.4)."""

from __future__ import annotations

import calendar
import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui.core.repeat import (
    FIRE_ALL_LIST_CAP,
    MissedFiresPolicy,
    RepeatableMeta,
    RepeatPattern,
    StoredSpec,
    derive_spec_key,
    pattern_from_wire,
    pattern_to_wire,
    plan_fires,
    policy_from_wire,
    policy_to_wire,
)
from airflow_provider_chasqui.errors import CodecError, ConfigError


def hx(text: str) -> bytes:
    return bytes.fromhex(" ".join(text.split()))


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return calendar.timegm((y, mo, d, h, mi, s)) * 1000


V1 = hx("""
81 a2 74 6f af 61 64 61 40 65 78 61 6d 70 6c 65
2e 63 6f 6d
""")

V9 = hx("""
c4 14 81 a2 74 6f af 61 64 61 40 65 78 61 6d 70
6c 65 2e 63 6f 6d
""")

V10 = hx("""
98 b3 72 65 70 6f 72 74 3a 3a 65 76 65 72 79 3a
36 30 30 30 30 a6 72 65 70 6f 72 74 81 a5 45 76
65 72 79 91 cd ea 60 c4 16 c4 14 81 a2 74 6f af
61 64 61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d c0
c0 c0 00
""")

V11 = hx("""
99 d9 28 6e 69 67 68 74 6c 79 3a 3a 63 72 6f 6e
3a 30 20 32 20 2a 20 2a 20 2a 3a 41 6d 65 72 69
63 61 2f 4e 65 77 5f 59 6f 72 6b a7 6e 69 67 68
74 6c 79 81 a4 43 72 6f 6e 92 a9 30 20 32 20 2a
20 2a 20 2a b0 41 6d 65 72 69 63 61 2f 4e 65 77
5f 59 6f 72 6b c4 16 c4 14 81 a2 74 6f af 61 64
61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d 0a c0 cf
00 00 01 b8 da c5 b4 00 00 81 a7 46 69 72 65 41
6c 6c 91 64
""")

V10_SPEC = StoredSpec(
    key="report::every:60000",
    job_name="report",
    pattern=RepeatPattern.every(60_000),
    payload_inner=V1,
)
V11_SPEC = StoredSpec(
    key="nightly::cron:0 2 * * *:America/New_York",
    job_name="nightly",
    pattern=RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
    payload_inner=V1,
    limit=10,
    end_before_ms=1_893_456_000_000,
    missed_fires=MissedFiresPolicy.fire_all(100),
)


# --------------------------------------------------------------------------- golden vectors


def test_vector_lengths_match_the_spec():
    assert (len(V1), len(V9), len(V10), len(V11)) == (20, 22, 67, 132)
    assert msgpack.unpackb(V1) == {"to": "ada@example.com"}


def test_v9_is_the_payload_slot():
    assert msgpack.unpackb(V10_SPEC.encode())[3] == V9


def test_v10_encode_and_decode():
    assert V10_SPEC.encode() == V10
    decoded = StoredSpec.decode(V10)
    assert decoded == V10_SPEC
    assert decoded.missed_fires == MissedFiresPolicy.skip()
    assert decoded.payload_inner == V1


def test_v11_encode_and_decode():
    assert V11_SPEC.encode() == V11
    decoded = StoredSpec.decode(V11)
    assert decoded == V11_SPEC
    assert (decoded.limit, decoded.start_after_ms, decoded.end_before_ms) == (10, None, 1_893_456_000_000)
    assert decoded.missed_fires.max_catchup == 100


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (RepeatPattern.cron("*/5 * * * *"), "81 a4 43 72 6f 6e 92 ab 2a 2f 35 20 2a 20 2a 20 2a 20 2a c0"),
        (RepeatPattern.every(1000), "81 a5 45 76 65 72 79 91 cd 03 e8"),
    ],
)
def test_v12_patterns(value, wire):
    assert msgpack.packb(pattern_to_wire(value), use_bin_type=True) == hx(wire)
    assert pattern_from_wire(msgpack.unpackb(hx(wire))) == value


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (MissedFiresPolicy.fire_once(), "a8 46 69 72 65 4f 6e 63 65"),
        (MissedFiresPolicy.skip(), "a4 53 6b 69 70"),
        (MissedFiresPolicy.fire_all(100), "81 a7 46 69 72 65 41 6c 6c 91 64"),
    ],
)
def test_v12_policies(value, wire):
    assert msgpack.packb(policy_to_wire(value), use_bin_type=True) == hx(wire)
    assert policy_from_wire(msgpack.unpackb(hx(wire))) == value


def test_fire_once_is_the_ninth_element():
    spec = dataclasses.replace(V10_SPEC, missed_fires=MissedFiresPolicy.fire_once())
    assert spec.encode() == b"\x99" + V10[1:] + hx("a8 46 69 72 65 4f 6e 63 65")
    assert StoredSpec.decode(spec.encode()) == spec


def test_explicit_skip_string_decodes_and_is_dropped_on_encode():
    with_skip = b"\x99" + V10[1:] + hx("a4 53 6b 69 70")
    assert StoredSpec.decode(with_skip) == V10_SPEC
    assert StoredSpec.decode(with_skip).encode() == V10


def test_fired_slot_is_ignored_and_written_as_zero():
    fired_7 = V10[:-1] + b"\x07"
    assert StoredSpec.decode(fired_7) == V10_SPEC
    assert StoredSpec.decode(fired_7).encode() == V10


def test_payload_as_array_of_u8_is_accepted():
    arr = msgpack.unpackb(V10)
    arr[3] = msgpack.packb(list(V1))
    assert StoredSpec.decode(msgpack.packb(arr, use_bin_type=True)).payload_inner == V1


def test_to_meta():
    meta = V11_SPEC.to_meta(1_700_000_000_000)
    assert meta == RepeatableMeta(
        key="nightly::cron:0 2 * * *:America/New_York",
        job_name="nightly",
        pattern=RepeatPattern.cron("0 2 * * *", tz="America/New_York"),
        next_fire_ms=1_700_000_000_000,
        limit=10,
        start_after_ms=None,
        end_before_ms=1_893_456_000_000,
        missed_fires=MissedFiresPolicy.fire_all(100),
    )


# --------------------------------------------------------------------------- decode errors


def _mutate(index: int, value: object) -> bytes:
    arr = msgpack.unpackb(V11)
    arr[index] = value
    return msgpack.packb(arr, use_bin_type=True)


BAD_SPECS = {
    "not msgpack": b"\xc1",
    "truncated": V10[:-3],
    "trailing bytes": V10 + b"\x00",
    "not an array": msgpack.packb({"key": "x"}),
    "7 elements": b"\x97" + V10[1:-1],
    "10 elements": b"\x9a" + V11[1:] + b"\x00",
    "key not str": _mutate(0, 5),
    "job_name bin": _mutate(1, b"nightly"),
    "pattern 2-entry map": _mutate(2, {"Cron": ["* * * * *", None], "Every": [1]}),
    "pattern unknown variant": _mutate(2, {"Weekly": [1]}),
    "pattern bare string": _mutate(2, "Cron"),
    "cron 1 field": _mutate(2, {"Cron": ["* * * * *"]}),
    "cron expr int": _mutate(2, {"Cron": [5, None]}),
    "every zero": _mutate(2, {"Every": [0]}),
    "every negative": _mutate(2, {"Every": [-1]}),
    "every float": _mutate(2, {"Every": [1.5]}),
    "every bool": _mutate(2, {"Every": [True]}),
    "payload str": _mutate(3, "hello"),
    "payload inner is a map": _mutate(3, msgpack.packb({"a": 1})),
    "payload inner not msgpack": _mutate(3, b"\xc1"),
    "limit negative": _mutate(4, -1),
    "limit bool": _mutate(4, True),
    "start_after str": _mutate(5, "1"),
    "end_before float": _mutate(6, 1.0),
    "fired nil": _mutate(7, None),
    "policy unknown": _mutate(8, "FireSome"),
    "fire_all over u32": _mutate(8, {"FireAll": [2**32]}),
    "fire_all no fields": _mutate(8, {"FireAll": []}),
    "fire_once with data": _mutate(8, {"FireOnce": [1]}),
    "not bytes at all": "a string",  # type: ignore[dict-item]
}


@pytest.mark.parametrize("data", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_specs_raise_codec_error(data):
    with pytest.raises(CodecError) as info:
        StoredSpec.decode(data)
    assert str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_only_ever_raise_codec_error(data):
    try:
        StoredSpec.decode(data)
    except CodecError:
        pass


# --------------------------------------------------------------------------- round trips

_u64 = st.integers(0, 2**64 - 1)
_opt_u64 = st.none() | _u64
_patterns = st.builds(RepeatPattern.every, st.integers(1, 2**64 - 1)) | st.builds(
    lambda expr, tz: RepeatPattern(kind="cron", expression=expr, tz=tz),
    st.text(min_size=1).filter(str.strip),
    st.none() | st.text(),
)
_policies = st.sampled_from([MissedFiresPolicy.skip(), MissedFiresPolicy.fire_once()]) | st.builds(
    MissedFiresPolicy.fire_all, st.integers(1, 2**32 - 1)
)
_specs = st.builds(
    StoredSpec,
    key=st.text(),
    job_name=st.text(),
    pattern=_patterns,
    payload_inner=st.binary(max_size=300),
    limit=_opt_u64,
    start_after_ms=_opt_u64,
    end_before_ms=_opt_u64,
    missed_fires=_policies,
)


@settings(max_examples=300, deadline=None)
@given(_specs)
def test_round_trip(spec):
    data = spec.encode()
    assert StoredSpec.decode(data) == spec
    assert StoredSpec.decode(data).encode() == data


@settings(max_examples=200, deadline=None)
@given(_specs)
def test_layout_matches_the_spec_table(spec):
    arr = msgpack.unpackb(spec.encode(), raw=False)
    assert len(arr) == (8 if spec.missed_fires.kind == "skip" else 9)
    assert arr[:2] == [spec.key, spec.job_name]
    assert msgpack.unpackb(arr[3]) == spec.payload_inner  # bin(bin(inner))
    assert arr[4:8] == [spec.limit, spec.start_after_ms, spec.end_before_ms, 0]
    if spec.pattern.kind == "every":
        assert arr[2] == {"Every": [spec.pattern.interval_ms]}
    else:
        assert arr[2] == {"Cron": [spec.pattern.expression, spec.pattern.tz]}


# --------------------------------------------------------------------------- keys


def test_derive_spec_key_examples():
    assert derive_spec_key("report", RepeatPattern.every(60_000)) == "report::every:60000"
    assert derive_spec_key("nightly", RepeatPattern.cron("0 2 * * *", tz="America/New_York")) == (
        "nightly::cron:0 2 * * *:America/New_York"
    )
    assert derive_spec_key("x", RepeatPattern.cron("* * * * *")) == "x::cron:* * * * *:UTC"
    assert derive_spec_key("x", RepeatPattern.cron("* * * * *", tz="")) == "x::cron:* * * * *:"
    assert derive_spec_key("x", RepeatPattern.cron("0 0 * * *", tz="US/Eastern")) == "x::cron:0 0 * * *:US/Eastern"


def test_explicit_key_wins_unless_empty():
    p = RepeatPattern.every(5)
    assert derive_spec_key("job", p, "my-key") == "my-key"
    assert derive_spec_key("job", p, "") == "job::every:5"
    assert derive_spec_key("job", p, None) == "job::every:5"
    with pytest.raises(ConfigError):
        derive_spec_key("job", p, 7)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- value types


@pytest.mark.parametrize("bad", [0, -5, True, False, 1.5, "10", None, 2**64])
def test_every_rejects_bad_intervals(bad):
    with pytest.raises(ConfigError, match="interval_ms"):
        RepeatPattern.every(bad)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "5", None, 2**32, float("nan")])
def test_fire_all_rejects_bad_caps(bad):
    with pytest.raises(ConfigError, match="max_catchup must be non-negative"):
        MissedFiresPolicy.fire_all(bad)


def test_fire_all_with_no_catch_up_round_trips_as_chasquimq_allows_it():
    """chasquimq takes ``fire_all(max_catchup=0)`` ("non-negative"), and its producers may store
    ``{"FireAll": [0]}``: it decodes (a scheduler here must not quarantine the spec) and plans
    as ``skip`` (tests/scheduler/test_sched_fire.py::test_missed_fire_policies_after_downtime)."""
    policy = MissedFiresPolicy.fire_all(0)
    assert policy_from_wire(policy_to_wire(policy)) == policy == policy_from_wire({"FireAll": [0]})


def test_pattern_shape_validation():
    with pytest.raises(ConfigError):
        RepeatPattern(kind="weekly")
    with pytest.raises(ConfigError):
        RepeatPattern(kind="every", interval_ms=5, tz="UTC")
    with pytest.raises(ConfigError):
        RepeatPattern(kind="cron", expression="* * * * *", interval_ms=5)
    with pytest.raises(ConfigError, match="Nowhere/Land"):
        RepeatPattern.cron("* * * * *", tz="Nowhere/Land")
    with pytest.raises(ConfigError):
        MissedFiresPolicy(kind="skip", max_catchup=3)


def test_value_types_are_frozen_and_match_chasquimq_vocabulary():
    p = RepeatPattern.cron("0 2 * * *", tz="Europe/Madrid")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tz = "UTC"  # type: ignore[misc]
    assert p.to_dict() == {"kind": "cron", "expression": "0 2 * * *", "tz": "Europe/Madrid"}
    assert RepeatPattern.cron("0 2 * * *").to_dict() == {"kind": "cron", "expression": "0 2 * * *"}
    assert RepeatPattern.every(500).to_dict() == {"kind": "every", "interval_ms": 500}
    assert [MissedFiresPolicy.skip().kind, MissedFiresPolicy.fire_once().kind, MissedFiresPolicy.fire_all(3).kind] == [
        "skip",
        "fire-once",
        "fire-all",
    ]
    assert MissedFiresPolicy.fire_all(3).to_dict() == {"kind": "fire-all", "max_catchup": 3}
    meta = RepeatableMeta("k", "j", p, 123)
    assert (meta.limit, meta.start_after_ms, meta.end_before_ms, meta.missed_fires) == (None, None, None, None)


def test_stored_spec_validation():
    with pytest.raises(ConfigError):
        StoredSpec("k", "j", RepeatPattern.every(1), "not bytes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        StoredSpec("k", "j", RepeatPattern.every(1), b"", limit=-1)
    with pytest.raises(ConfigError):
        StoredSpec("k", "j", {"kind": "every"}, b"")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- plan_fires

T = ms(2024, 5, 1, 12)
EVERY_MIN = RepeatPattern.every(60_000)
ALL_POLICIES = [MissedFiresPolicy.skip(), MissedFiresPolicy.fire_once(), MissedFiresPolicy.fire_all(5)]


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_fast_path_fires_once_at_the_score(policy):
    assert plan_fires(EVERY_MIN, T, T + 500, None, policy) == ([T], T + 60_000)
    assert plan_fires(EVERY_MIN, T, T + 60_000, None, policy) == ([T], T + 60_000)  # cadence == now
    assert plan_fires(EVERY_MIN, T, T - 10, None, policy) == ([T], T + 60_000)  # future-dated score


def test_late_ticks_do_not_drift_the_cadence():
    score = T
    for lateness in (700, 0, 59_999, 12, 30_000):
        fired, score_next = plan_fires(EVERY_MIN, score, score + lateness, None, MissedFiresPolicy.skip())
        assert fired == [score]
        assert score_next == score + 60_000
        score = score_next
    assert score == T + 5 * 60_000


def test_start_after_applies_to_cadence():
    assert plan_fires(EVERY_MIN, T, T + 10, T + 100_000, MissedFiresPolicy.skip()) == ([T], T + 160_000)


def test_missed_windows_per_policy_every():
    now = T + 150_000  # windows T, T+60s, T+120s are due; T+180s is the first future one
    assert plan_fires(EVERY_MIN, T, now, None, MissedFiresPolicy.skip()) == ([], T + 180_000)
    assert plan_fires(EVERY_MIN, T, now, None, MissedFiresPolicy.fire_once()) == ([T], T + 180_000)
    assert plan_fires(EVERY_MIN, T, now, None, MissedFiresPolicy.fire_all(100)) == (
        [T, T + 60_000, T + 120_000],
        T + 180_000,
    )
    assert plan_fires(EVERY_MIN, T, now, None, MissedFiresPolicy.fire_all(2)) == ([T, T + 60_000], T + 180_000)
    assert plan_fires(EVERY_MIN, T, now, None, MissedFiresPolicy.fire_all(1)) == ([T], T + 180_000)


def test_missed_windows_per_policy_cron():
    hourly = RepeatPattern.cron("0 * * * *")
    t10, now = ms(2024, 1, 1, 10), ms(2024, 1, 1, 12, 30)
    assert plan_fires(hourly, t10, now, None, MissedFiresPolicy.skip()) == ([], ms(2024, 1, 1, 13))
    assert plan_fires(hourly, t10, now, None, MissedFiresPolicy.fire_once()) == ([t10], ms(2024, 1, 1, 13))
    assert plan_fires(hourly, t10, now, None, MissedFiresPolicy.fire_all(10)) == (
        [t10, ms(2024, 1, 1, 11), ms(2024, 1, 1, 12)],
        ms(2024, 1, 1, 13),
    )
    assert plan_fires(hourly, t10, now, None, MissedFiresPolicy.fire_all(2)) == (
        [t10, ms(2024, 1, 1, 11)],
        ms(2024, 1, 1, 13),
    )


def test_skip_across_a_dst_gap():
    # 02:30 New York daily; score Mar 9 02:30 EST (07:30Z), scheduler back on Mar 10 12:00Z.
    p = RepeatPattern.cron("30 2 * * *", tz="America/New_York")
    got = plan_fires(p, ms(2024, 3, 9, 7, 30), ms(2024, 3, 10, 12), None, MissedFiresPolicy.skip())
    assert got == ([], ms(2024, 3, 11, 6, 30))


def test_fire_all_list_is_capped_at_ten_thousand():
    p = RepeatPattern.every(1_000)
    fired, nxt = plan_fires(p, 0, 20_000_000, None, MissedFiresPolicy.fire_all(50_000))
    assert FIRE_ALL_LIST_CAP == 10_000
    assert len(fired) == 10_000
    assert (fired[0], fired[1], fired[-1]) == (0, 1_000, 9_999_000)
    assert nxt == 20_001_000


def test_fire_all_cron_list_cap():
    p = RepeatPattern.cron("* * * * * *")
    t0 = ms(2024, 1, 1)
    fired, nxt = plan_fires(p, t0, t0 + 12_000_000, None, MissedFiresPolicy.fire_all(20_000))
    assert len(fired) == 10_000 and fired[-1] == t0 + 9_999_000
    assert nxt == t0 + 12_001_000


def test_no_future_fire_removes_the_spec():
    never = RepeatPattern.cron("0 0 30 2 *")
    assert plan_fires(never, T, T + 1, None, MissedFiresPolicy.skip()) == ([], 0)
    assert plan_fires(never, T, T + 1, None, MissedFiresPolicy.fire_once()) == ([T], 0)
    assert plan_fires(never, T, T + 1, None, MissedFiresPolicy.fire_all(3)) == ([T], 0)


def test_a_long_outage_resumes_on_the_timeline():
    p = RepeatPattern.every(1)
    assert plan_fires(p, 0, 200_000, None, MissedFiresPolicy.skip()) == ([], 200_001)
    assert plan_fires(p, 0, 200_000, None, MissedFiresPolicy.fire_once()) == ([0], 200_001)
    fired, nxt = plan_fires(p, 0, 200_000, None, MissedFiresPolicy.fire_all(3))
    assert fired == [0, 1, 2] and nxt == 200_001
    fired, nxt = plan_fires(p, 0, 200_000, None, MissedFiresPolicy.fire_all(2**32 - 1))
    assert fired == list(range(10_000)) and nxt == 200_001  # the backlog is capped at the list cap
    fired, nxt = plan_fires(p, 0, 50_000, None, MissedFiresPolicy.fire_all(3))
    assert fired == [0, 1, 2] and nxt == 50_001
