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


# ---- arguments chasquimq accepts and drops: honoured or refused here (issue #17) -------------


@pytest.mark.parametrize("twin", ["async", "sync"])
async def test_delay_with_repeat_is_refused_not_dropped(twin: str) -> None:
    """chasquimq drops ``delay`` when ``repeat`` is given; a spec that silently fires at once
    when the caller asked for a delay is a surprise, so it is a ConfigError naming the way."""
    name = _name()
    every = {"kind": "every", "interval_ms": 60_000}
    for kwargs in ({"delay": 5.0}, {"delay_ms": 5000}):
        with pytest.raises(ConfigError, match=r"delay/delay_ms do not apply.*start_after"):
            if twin == "async":
                async with Queue(name, redis_url=URL) as q:
                    await q.add("tick", {}, repeat=every, **kwargs)
            else:
                with SyncQueue(name, redis_url=URL) as sq:
                    sq.add("tick", {}, repeat=every, **kwargs)
    with SyncQueue(name, redis_url=URL) as sq:
        assert sq.get_repeatable_jobs() == []  # nothing was written


async def test_job_id_of_a_repeatable_spec_is_its_key(queue: Queue) -> None:
    """chasquimq drops ``job_id`` on upserts; here it names the spec (the returned Job's id is the
    key), and a different ``key`` beside it is refused."""
    every = {"kind": "every", "interval_ms": 60_000}
    job = await queue.add("tick", {"n": 1}, repeat=every, job_id="nightly-report")
    assert job.id == "nightly-report"
    assert [m.key for m in await queue.get_repeatable_jobs()] == ["nightly-report"]
    same = await queue.upsert_repeatable_job(
        "tick", {"n": 2}, repeat=every, job_id="nightly-report", key="nightly-report"
    )
    assert same.id == "nightly-report" and len(await queue.get_repeatable_jobs()) == 1  # an upsert, not a second spec
    with pytest.raises(ConfigError, match="both name the spec"):
        await queue.upsert_repeatable_job("tick", {}, repeat=every, job_id="a", key="b")
    for bad in ("", 7):
        with pytest.raises(ConfigError, match="non-empty str"):
            await queue.upsert_repeatable_job("tick", {}, repeat=every, job_id=bad)  # type: ignore[arg-type]
    assert len(await queue.get_repeatable_jobs()) == 1


async def test_poll_interval_is_checked(queue: Queue) -> None:
    job = await queue.add("x", {"k": 1})
    for bad in (0, -1, math.nan, math.inf, "1", True):
        with pytest.raises(ConfigError, match="poll_interval"):
            await job.wait_for_result(timeout=0.1, poll_interval=bad)
    with pytest.raises(TimeoutError):  # a valid one is accepted (nothing runs the job)
        await job.wait_for_result(timeout=0.2, poll_interval=0.05)
