"""API parity details that code written for chasquimq's Python package relies on.

chasquimq's own suite (``chasquimq-py/tests``) is not shipped in its wheel or an sdist, so it cannot
run here; these tests pin the same observable contract with our own assertions: which built-in
exception class a bad argument raises (so ``except RuntimeError``/``TypeError``/``ValueError`` in
chasquimq code catches ours), the words its messages are matched on, and the ``Worker`` signature.
"""

from __future__ import annotations

import inspect
import math
import uuid
from datetime import timedelta

import pytest

from airflow_provider_chasqui import ConfigError, Queue, SyncQueue, Worker, WorkerSettings

pytestmark = pytest.mark.timeout(60)

URL = "redis://127.0.0.1:6379"


def _name() -> str:
    return f"parity-{uuid.uuid4().hex}"


@pytest.fixture
async def queue():
    q = Queue(_name(), redis_url=URL)
    yield q
    await q.close()


async def test_oversized_name_is_a_runtime_error_naming_the_limit(queue: Queue) -> None:
    with pytest.raises(RuntimeError, match="256") as info:
        await queue.add("x" * 257, {"k": 1})
    assert isinstance(info.value, ConfigError)  # and still the package's own bad-argument error
    # 256 bytes, not characters: a 2-byte character pushes a 129-character name over
    with pytest.raises(RuntimeError, match="258 bytes"):
        await queue.add("é" * 129, {"k": 1})
    await queue.add("x" * 256, {"k": 1})  # the limit itself is allowed


@pytest.mark.parametrize("backoff", ["not-a-thing", True, 1.5, [100]])
async def test_backoff_of_the_wrong_type_is_a_type_error(queue: Queue, backoff: object) -> None:
    with pytest.raises(TypeError, match="backoff"):
        await queue.add("x", {"k": 1}, backoff=backoff)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay_ms", [math.inf, -math.inf, math.nan])
async def test_non_finite_delay_says_finite_non_negative(queue: Queue, delay_ms: float) -> None:
    with pytest.raises(ValueError, match="finite non-negative"):
        await queue.add("x", {"k": 1}, delay_ms=delay_ms)


@pytest.mark.parametrize("kwargs", [{"delay_ms": -1}, {"delay_ms": -0.5}, {"delay": timedelta(milliseconds=-100)}])
async def test_negative_delay_says_non_negative(queue: Queue, kwargs: dict) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        await queue.add("x", {"k": 1}, **kwargs)


async def test_both_delay_arguments_say_not_both(queue: Queue) -> None:
    with pytest.raises(ValueError, match="not both"):
        await queue.add("x", {"k": 1}, delay_ms=1_000, delay=timedelta(seconds=1))


def test_the_blocking_twin_raises_the_same_classes() -> None:
    q = SyncQueue(_name(), redis_url=URL)
    try:
        with pytest.raises(RuntimeError, match="256"):
            q.add("x" * 257, {})
        with pytest.raises(TypeError, match="backoff"):
            q.add("x", {}, backoff="fast")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finite non-negative"):
            q.add("x", {}, delay_ms=math.nan)
    finally:
        q.close()


def test_worker_signature_shows_chasquimq_default_concurrency() -> None:
    param = inspect.signature(Worker.__init__).parameters["concurrency"]
    assert param.default == 100 == WorkerSettings().concurrency


def test_concurrency_argument_and_settings_agree() -> None:
    def handler(job):  # never called: nothing runs
        return None

    assert Worker(_name(), handler).settings.concurrency == 100
    assert Worker(_name(), handler, concurrency=7).settings.concurrency == 7
    # a given settings object keeps its own value unless the argument says otherwise
    assert Worker(_name(), handler, settings=WorkerSettings(concurrency=3)).settings.concurrency == 3
    assert Worker(_name(), handler, settings=WorkerSettings(concurrency=3), concurrency=9).settings.concurrency == 9
    for bad in (0, -1, True, 2.5, "4"):
        with pytest.raises(ConfigError, match="concurrency"):
            Worker(_name(), handler, concurrency=bad)  # type: ignore[arg-type]
