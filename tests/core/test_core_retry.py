"""Backoff maths of wire spec 14.1 (pure; no clocks, seeded randomness)."""

from __future__ import annotations

import random

import pytest

from airflow_provider_chasqui.core.codec import BackoffWire
from airflow_provider_chasqui.core.retry import RetryPolicy, backoff_ms
from airflow_provider_chasqui.types import BackoffSpec, coerce_backoff

NO_JITTER = RetryPolicy(jitter_ms=0)


def test_defaults_double_from_100_ms_up_to_the_cap() -> None:
    got = [backoff_ms(n, None, NO_JITTER) for n in range(1, 13)]
    assert got == [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]


def test_retry_number_zero_uses_exponent_zero() -> None:
    assert backoff_ms(0, None, NO_JITTER) == 100


def test_default_jitter_is_uniform_in_0_to_99() -> None:
    rng = random.Random(7)
    samples = [backoff_ms(1, None, RetryPolicy(), rng) - 100 for _ in range(3000)]
    assert min(samples) == 0 and max(samples) == 99
    assert len(set(samples)) == 100


def test_jitter_may_exceed_the_cap() -> None:
    rng = random.Random(1)
    values = {backoff_ms(30, None, RetryPolicy(jitter_ms=10), rng) for _ in range(500)}
    assert values == set(range(30_000, 30_010))


def test_fixed_backoff_ignores_the_retry_number() -> None:
    spec = BackoffWire("fixed", 500, None, None, 0)
    assert {backoff_ms(n, spec, RetryPolicy()) for n in range(20)} == {500}


def test_fixed_is_clamped_to_the_cap_too() -> None:
    assert backoff_ms(1, BackoffWire("fixed", 50_000, None, None, 0), RetryPolicy()) == 30_000
    assert backoff_ms(1, BackoffWire("fixed", 50_000, 60_000, None, 0), RetryPolicy()) == 50_000


def test_shim_int_backoff_keeps_the_queue_jitter() -> None:
    """``backoff=500`` is fixed with every other field nil, so the 100 ms jitter still applies."""
    spec = coerce_backoff(500).to_wire()
    assert spec == BackoffWire("fixed", 500, None, None, None)
    rng = random.Random(3)
    values = {backoff_ms(1, spec, RetryPolicy(), rng) for _ in range(2000)}
    assert min(values) == 500 and max(values) == 599


def test_exponential_per_job_override_v4() -> None:
    spec = BackoffSpec.exponential(250, multiplier=3.0, max_ms=10_000, jitter_ms=0).to_wire()
    assert [backoff_ms(n, spec, RetryPolicy()) for n in range(1, 7)] == [250, 750, 2250, 6750, 10_000, 10_000]


def test_per_job_nil_fields_fall_back_to_the_queue_policy() -> None:
    policy = RetryPolicy(initial_ms=1, max_ms=1000, multiplier=10.0, jitter_ms=0)
    spec = BackoffWire("exponential", 2, None, None, None)  # cap, multiplier, jitter from the policy
    assert [backoff_ms(n, spec, policy) for n in range(1, 5)] == [2, 20, 200, 1000]


def test_unknown_kind_is_treated_as_exponential() -> None:
    spec = BackoffWire("linear", 100, None, 2.0, 0)
    assert [backoff_ms(n, spec, RetryPolicy()) for n in (1, 2, 3)] == [100, 200, 400]


def test_fractional_results_are_floored() -> None:
    spec = BackoffWire("exponential", 100, None, 1.5, 0)
    assert backoff_ms(4, spec, RetryPolicy()) == 337  # 100 * 1.5^3 = 337.5


def test_huge_retry_numbers_saturate_at_the_cap() -> None:
    """f64 overflows to infinity in Rust and is clamped; Python must not raise OverflowError."""
    assert backoff_ms(5000, None, NO_JITTER) == 30_000
    assert backoff_ms(2**32 - 1, BackoffWire("exponential", 1, 7, 1e300, 0), RetryPolicy()) == 7


def test_zero_delay_stays_zero() -> None:
    assert backoff_ms(9, BackoffWire("exponential", 0, None, None, 0), RetryPolicy()) == 0


def test_zero_jitter_means_no_randomness() -> None:
    class Boom(random.Random):
        def randrange(self, *a, **k):  # pragma: no cover - must not be called
            raise AssertionError("jitter drawn although jitter_ms is 0")

    assert backoff_ms(1, BackoffWire("fixed", 5, None, None, 0), RetryPolicy(), Boom()) == 5


@pytest.mark.parametrize(
    "spec",
    [
        BackoffSpec("fixed", 1),
        BackoffSpec.fixed(10, jitter_ms=3),
        BackoffSpec.exponential(5, multiplier=1.5, max_ms=100, jitter_ms=0),
    ],
)
def test_backoffspec_dict_round_trip(spec: BackoffSpec) -> None:
    assert coerce_backoff(spec.to_dict()) == spec
