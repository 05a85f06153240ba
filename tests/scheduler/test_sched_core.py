"""The scheduler's pure pieces (no Redis): fire ids, the fast codecs against the reference
ones, the ext field, argument coercion, shard routing and the cluster URL option."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui.core.codec import BackoffWire, RetryOverride, new_job_id, ulid_ms
from airflow_provider_chasqui.core.repeat import MissedFiresPolicy, RepeatPattern, StoredSpec
from airflow_provider_chasqui.core.scheduler import SchedulerCore, fire_job_id
from airflow_provider_chasqui.core.schedules import SpecFlows, _encode_spec
from airflow_provider_chasqui.core.sharding import decode_cursor, encode_cursor, shard_of, shard_queue_names
from airflow_provider_chasqui.core.spec_decode import SpecDecoder
from airflow_provider_chasqui.core.spec_ext import SpecExt
from airflow_provider_chasqui.core.spec_options import coerce_pattern, coerce_policy
from airflow_provider_chasqui.core.urls import split_cluster_flag
from airflow_provider_chasqui.errors import CodecError, ConfigError

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

patterns = st.one_of(
    st.integers(1, 2**64 - 1).map(RepeatPattern.every),
    st.sampled_from(["* * * * *", "0 2 * * *", "*/15 * * * * *", "0 9 * * 1-5"]).flatmap(
        lambda e: st.sampled_from([None, "UTC", "America/New_York", "+05:30"]).map(
            lambda tz: RepeatPattern.cron(e, tz=tz)
        )
    ),
)
policies = st.one_of(
    st.just(MissedFiresPolicy.skip()),
    st.just(MissedFiresPolicy.fire_once()),
    st.integers(1, 2**32 - 1).map(MissedFiresPolicy.fire_all),
)
opt_u64 = st.one_of(st.none(), st.integers(0, 2**64 - 1))
specs = st.builds(
    StoredSpec,
    st.text(max_size=40),
    st.text(max_size=20),
    patterns,
    st.binary(max_size=70_000),
    opt_u64,
    opt_u64,
    opt_u64,
    policies,
)


def reference_ulid(spec_key: str, fire_at_ms: int) -> str:
    import hashlib

    digest = hashlib.blake2b(f"{fire_at_ms}\0{spec_key}".encode(), digest_size=10).digest()
    value = (fire_at_ms << 80) | int.from_bytes(digest, "big")
    return "".join(CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


@given(st.text(max_size=30), st.integers(0, 2**48 - 1))
def test_fire_id_matches_a_plain_ulid_encoding(key: str, at: int) -> None:
    assert fire_job_id(key, at) == reference_ulid(key, at)


def test_fire_ids_are_canonical_deterministic_ulids() -> None:
    a = fire_job_id("report::every:60000", 1_795_330_800_746)
    assert len(a) == 26 and set(a) <= set(CROCKFORD) and a[0] in "01234567"
    assert a == fire_job_id("report::every:60000", 1_795_330_800_746)
    assert a != fire_job_id("report::every:60000", 1_795_330_860_746)
    assert a != fire_job_id("report::every:6000", 1_795_330_800_746)
    assert ulid_ms(a) == 1_795_330_800_746
    assert ulid_ms(new_job_id(1_700_000_000_123)) == 1_700_000_000_123  # same layout as random ids
    assert fire_job_id("k", 2**48 - 1)[:10] == "7ZZZZZZZZZ"


@settings(max_examples=300, deadline=None)
@given(spec=specs)
def test_fast_decode_equals_the_reference_decoder(spec: StoredSpec) -> None:
    raw = spec.encode()
    assert StoredSpec.decode(raw) == spec
    want = (
        spec.key,
        spec.job_name,
        spec.pattern,
        spec.payload_inner,
        spec.limit,
        spec.start_after_ms,
        spec.end_before_ms,
        spec.missed_fires,
    )
    decode = SpecDecoder().decode
    assert tuple(decode(raw))[:8] == want
    assert tuple(decode(raw))[:8] == want  # the cached pattern/policy path too


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",
        msgpack.packb([1, 2, 3]),
        msgpack.packb(["k", "n", {"Every": [0]}, b"\xc4\x00", None, None, None, 0]),
        msgpack.packb(["k", "n", {"Every": [5]}, b"\xc4\x05ab", None, None, None, 0]),
        msgpack.packb(["k", "n", {"Every": [5]}, b"\xc4\x00", -1, None, None, 0]),
        msgpack.packb(["k", "n", {"Every": [5]}, b"\xc4\x00", None, None, None, 0, "Never"]),
    ],
)
def test_fast_decode_rejects_what_the_reference_rejects(raw: bytes) -> None:
    with pytest.raises(CodecError):
        StoredSpec.decode(raw)
    with pytest.raises(CodecError):
        SpecDecoder().decode(raw)


def test_fast_decode_cache_never_confuses_true_or_floats_with_ints() -> None:
    good = msgpack.packb(["k", "n", {"Every": [1]}, b"\xc4\x00", None, None, None, 0, {"FireAll": [1]}])
    decode = SpecDecoder().decode
    assert decode(good).pattern == RepeatPattern.every(1)  # now cached
    for body, policy in (([True], [1]), ([1.0], [1]), ([1], [True]), ([1], [1.0])):
        raw = msgpack.packb(["k", "n", {"Every": body}, b"\xc4\x00", None, None, None, 0, {"FireAll": policy}])
        with pytest.raises(CodecError):
            StoredSpec.decode(raw)
        with pytest.raises(CodecError):
            decode(raw)


def test_each_scheduler_owns_its_decode_caches() -> None:
    """The pattern/policy caches live on the scheduler: decoding with one leaves another's empty."""
    raw = StoredSpec("k", "n", RepeatPattern.every(7), b"\x01").encode()
    a, b = SchedulerCore("sched-core-a"), SchedulerCore("sched-core-b")
    da, db = a._decoder, b._decoder
    assert da is not db
    assert da.decode(raw).pattern == RepeatPattern.every(7)
    assert list(da.patterns.values()) == [RepeatPattern.every(7)]
    assert db.patterns == {}
    assert da.decode(raw)[:8] == db.decode(raw)[:8]  # (the cached path and the first decode)


@settings(max_examples=200, deadline=None)
@given(spec=specs)
def test_fast_encode_equals_storedspec_encode(spec: StoredSpec) -> None:
    assert (
        _encode_spec(
            spec.key,
            spec.job_name,
            spec.pattern,
            spec.payload_inner,
            spec.limit,
            spec.start_after_ms,
            spec.end_before_ms,
            spec.missed_fires,
        )
        == spec.encode()
    )


def test_bulk_fast_path_gives_the_same_bytes_as_prepare() -> None:
    flows = SpecFlows("q")
    items = [
        {"name": "n", "data": {"i": i}, "repeat": RepeatPattern.every(1000 + i % 3), "key": None if i % 2 else f"k{i}"}
        for i in range(20)
    ]
    # payloads around the bin8/bin16 edges, cron in a zone, a non-ASCII name, an ext (general path)
    items += [
        {"name": "ñandú" * 3, "data": "x" * size, "repeat": RepeatPattern.cron("0 3 * * *", tz="Europe/Madrid")}
        for size in (0, 249, 250, 251, 252, 253, 300, 70_000)
    ]
    items += [{"name": "n", "data": 1, "repeat": RepeatPattern.every(5000), "key": "with-ext", "attempts": 3}]
    fast = flows.prepare_bulk(items, now=1_000)
    slow = [flows.prepare(**item, now=1_000) for item in items]
    assert fast == slow


def test_spec_ext_round_trip_and_errors() -> None:
    ext = SpecExt(RetryOverride(5, BackoffWire("exponential", 250, 10_000, 3.0, 50)), 60_000)
    assert SpecExt.decode(ext.encode()) == ext
    assert SpecExt.decode(None) == SpecExt() and SpecExt().empty
    assert msgpack.unpackb(SpecExt(None, 5).encode()) == [1, None, 5]
    for bad in (b"\xc1", msgpack.packb([2, None, None]), msgpack.packb([1, None, 0]), msgpack.packb([1, [1], None])):
        with pytest.raises(CodecError):
            SpecExt.decode(bad)


def test_coercion_accepts_chasquimq_and_dict_forms() -> None:
    class Foreign:  # the shape of chasquimq.RepeatPattern / MissedFiresPolicy
        kind, expression, tz, interval_ms, max_catchup = "cron", "0 2 * * *", "Europe/Madrid", None, None

    assert coerce_pattern(Foreign()) == RepeatPattern.cron("0 2 * * *", tz="Europe/Madrid")
    assert coerce_pattern({"kind": "every", "interval_ms": 5}) == RepeatPattern.every(5)
    assert coerce_policy({"kind": "fire-all"}) == MissedFiresPolicy.fire_all(100)  # the native binding's default
    assert coerce_policy("fire_once") == MissedFiresPolicy.fire_once()
    assert coerce_policy(None) == MissedFiresPolicy.skip()
    with pytest.raises(ConfigError, match="unknown repeat keys"):
        coerce_pattern({"kind": "every", "interval_ms": 5, "tz": "UTC"})
    with pytest.raises(ConfigError, match="unknown timezone"):
        coerce_pattern(RepeatPattern(kind="cron", expression="* * * * *", tz="Atlantis/Capital"))
    with pytest.raises(ConfigError, match="max_catchup"):
        coerce_policy("fire-all")


def test_prepare_accepts_datetimes_and_timedeltas() -> None:
    flows = SpecFlows("q")
    start = datetime(2030, 1, 1, 12, tzinfo=UTC)
    p = flows.prepare(
        "n",
        1,
        repeat=RepeatPattern.every(1000),
        start_after=start.replace(tzinfo=None),
        end_before=start + timedelta(days=1),
        deadline=timedelta(seconds=90),
        now=0,
    )
    spec = StoredSpec.decode(p.spec)
    assert (spec.start_after_ms, spec.end_before_ms) == (1_893_499_200_000, 1_893_585_600_000)
    assert p.next_fire_ms == 1_893_499_201_000 and SpecExt.decode(p.ext).deadline_ms == 90_000


def test_shard_routing_is_stable() -> None:
    assert shard_queue_names("emails", 3) == ["emails.0", "emails.1", "emails.2"]
    assert shard_of("report::every:60000", 8) == zlib.crc32(b"report::every:60000") % 8
    counts = [0] * 16
    for i in range(16_000):
        counts[shard_of(f"user-{i}", 16)] += 1
    assert min(counts) > 800  # spread
    assert decode_cursor(None, 4) == (0, None)
    assert decode_cursor(encode_cursor(2, "r:17"), 4) == (2, "r:17")
    assert encode_cursor(1, None) is None
    for bad in ("x", "9/r:0", "1"):
        with pytest.raises(ConfigError):
            decode_cursor(bad, 4)
    with pytest.raises(ConfigError):
        shard_queue_names("emails", 0)
    with pytest.raises(ConfigError):
        shard_queue_names("bad{name", 2)


def test_cluster_url_option() -> None:
    assert split_cluster_flag("redis://h:1/0") == ("redis://h:1/0", False)
    assert split_cluster_flag("redis://h:1/0?cluster=true") == ("redis://h:1/0", True)
    assert split_cluster_flag("redis://h:1/0?cluster=1&socket_timeout=5") == ("redis://h:1/0?socket_timeout=5", True)
    assert split_cluster_flag("redis://h:1/0?cluster=false", True) == ("redis://h:1/0", True)
    assert split_cluster_flag("redis://h:1/0", True) == ("redis://h:1/0", True)
    with pytest.raises(ConfigError):
        split_cluster_flag("redis://h:1/0?cluster=maybe")
