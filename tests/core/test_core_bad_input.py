"""Bad input fails at the call with a clear error, before any byte goes to Redis.

Every queue here points at a closed port: if validation let something through, the test
would see a connection error instead of the expected ``ConfigError``.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from airflow_provider_chasqui import BackoffSpec, ChasquiError, ConfigError, Queue
from airflow_provider_chasqui.core.settings import QueueSettings

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
async def q():
    queue = Queue("bad-input", redis_url=NOWHERE)
    yield queue
    await queue.close()


@pytest.mark.parametrize("name", ["", "a{b", "b}", "x\ny", "q" * 257, 5])
def test_bad_queue_name_fails_at_construction(name) -> None:
    with pytest.raises(ConfigError):
        Queue(name, redis_url=NOWHERE)


async def test_job_name_over_256_bytes(q: Queue) -> None:
    with pytest.raises(ConfigError, match="256"):
        await q.add("n" * 257, {})
    with pytest.raises(ConfigError):
        await q.add("€" * 86, {})  # 258 bytes in 86 characters
    with pytest.raises(ConfigError):
        await q.add(None, {})


@pytest.mark.parametrize(
    "data",
    [object(), {1, 2}, 2**64, -(2**63) - 1, {"when": timedelta(1)}, [1, [2, lambda: 3]]],
    ids=["object", "set", "uint-overflow", "int-underflow", "timedelta", "nested-lambda"],
)
async def test_data_msgpack_cannot_encode(q: Queue, data) -> None:
    with pytest.raises(ConfigError, match="msgpack"):
        await q.add("job", data)


async def test_oversize_payload() -> None:
    small = Queue("bad-input", redis_url=NOWHERE, settings=QueueSettings(max_payload_bytes=64))
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        await small.add("job", "x" * 100)
    with pytest.raises(ConfigError):
        await small.add_bulk([{"name": "ok", "data": 1}, {"name": "big", "data": "x" * 100}])
    default = Queue("bad-input", redis_url=NOWHERE)
    with pytest.raises(ConfigError, match="1048576"):
        await default.add("job", b"x" * (1024 * 1024))
    await small.close()
    await default.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": -0.5},
        {"delay": timedelta(seconds=-1)},
        {"delay_ms": -1},
        {"delay_ms": -1.0},
        {"delay": math.nan},
        {"delay": math.inf},
        {"delay": -math.inf},
        {"delay_ms": math.nan},
        {"delay_ms": math.inf},
        {"delay": 5, "delay_ms": 5},
    ],
    ids=[
        "neg-int",
        "neg-float",
        "neg-timedelta",
        "neg-delay-ms",
        "neg-delay-ms-float",
        "nan",
        "inf",
        "-inf",
        "nan-ms",
        "inf-ms",
        "both",
    ],
)
async def test_bad_delays_are_value_errors(q: Queue, kwargs) -> None:
    with pytest.raises(ConfigError) as info:
        await q.add("job", {}, **kwargs)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [{"delay": True}, {"delay_ms": False}, {"delay": "5"}, {"delay_ms": [1]}],
    ids=["bool", "bool-ms", "str", "list"],
)
async def test_delay_of_the_wrong_type_is_a_type_error(q: Queue, kwargs) -> None:
    """chasquimq raises TypeError here; we do too, and it is still one of our errors."""
    with pytest.raises(TypeError) as info:
        await q.add("job", {}, **kwargs)
    assert isinstance(info.value, ChasquiError)


async def test_delay_over_max_delay_secs(q: Queue) -> None:
    with pytest.raises(ConfigError, match="max_delay_secs"):
        await q.add("job", {}, delay=timedelta(days=31))
    bounded = Queue("bad-input", redis_url=NOWHERE, max_delay_secs=10)
    with pytest.raises(ConfigError):
        await bounded.add("job", {}, delay_ms=11_000)
    await bounded.close()


@pytest.mark.parametrize(
    "backoff",
    [
        {"kind": "linear", "delay_ms": 5},
        {"kind": "fixed"},
        {"kind": "fixed", "delay_ms": 5, "extra": 1},
        True,
        "fixed",
        1.5,
        {"kind": "fixed", "delay_ms": -1},
        {"kind": "exponential", "delay_ms": 1, "multiplier": math.nan},
    ],
    ids=["unknown-kind", "no-delay", "unknown-key", "bool", "str", "float", "negative", "nan-multiplier"],
)
async def test_bad_backoff(q: Queue, backoff) -> None:
    with pytest.raises(ConfigError):
        await q.add("job", {}, backoff=backoff)


def test_unknown_backoff_kind_in_the_value_type() -> None:
    with pytest.raises(ConfigError, match="linear"):
        BackoffSpec("linear", 100)
    with pytest.raises(ConfigError):
        BackoffSpec("fixed", -1)
    with pytest.raises(ConfigError):
        BackoffSpec.exponential(10, multiplier=0)


@pytest.mark.parametrize("attempts", [-1, True, 1.5, "3"])
async def test_bad_attempts(q: Queue, attempts) -> None:
    with pytest.raises(ConfigError):
        await q.add("job", {}, attempts=attempts)


@pytest.mark.parametrize("job_id", ["", "   ", "x" * 1025, 5])
async def test_bad_job_id(q: Queue, job_id) -> None:
    with pytest.raises(ConfigError):
        await q.add("job", {}, job_id=job_id)


async def test_bad_bulk_items(q: Queue) -> None:
    for items in (
        [{"name": "a"}],
        [{"data": 1}],
        [{"name": "a", "data": 1, "lifo": True}],  # an option this project does not have
        [{"name": "a", "data": 1, "priority": 0}],
        ["not a dict"],
        [{"name": "a", "data": 1}, {"name": "b", "data": object()}],
    ):
        with pytest.raises(ConfigError):
            await q.add_bulk(items)


@pytest.mark.parametrize("window", [0, -1, True, "1"])
async def test_bad_unique_window(q: Queue, window) -> None:
    with pytest.raises(ConfigError):
        await q.add_unique("job", {}, window=window)


async def test_missed_fires_without_repeat(q: Queue) -> None:
    with pytest.raises(ConfigError):
        await q.add("job", {}, missed_fires="skip")
