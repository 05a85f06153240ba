"""Wrong types and out-of-range numbers in the queues' arguments: a ``ConfigError`` naming the
argument, raised before any I/O (the queues here point at a port where nothing listens, so a
call that reached the network would fail differently), never a bare ``TypeError``,
``OverflowError`` or ``ValueError`` from deep inside (``'float' object is not iterable``,
``can only concatenate str (not "int") to str``, msgpack's ``Integer value out of range``).
A wrong type is a ``ConfigTypeError``: a ``ConfigError`` and a ``TypeError`` both, as
chasquimq raises a ``TypeError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_chasqui import ConfigError, Promoter, Queue, QueueEvents, Scheduler, SyncQueue, Worker
from airflow_provider_chasqui.core.codec import U32_MAX, U64_MAX
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import ConfigTypeError

pytestmark = pytest.mark.timeout(60)

UNREACHABLE = "redis://127.0.0.1:1/0"
NOT_A_STR = [5, 1.5, float("nan"), None, True, b"id", ["id"], {"id": 1}]
NOT_A_LIST = [5, float("inf"), None, True, "abc", b"abc", {"name": "n", "data": 1}]


def _lookups(q: SyncQueue) -> dict[str, Callable[[Any], Any]]:
    return {
        "get_job_state": q.get_job_state,
        "get_job_result": q.get_job_result,
        "get_failure": q.get_failure,
        "cancel_delayed": q.cancel_delayed,
        "cancel": q.cancel,
        "get_job_details": q.get_job_details,
        "wait_for_result": lambda v: q.wait_for_result(v, timeout=1),
        "get_job_result_bulk": lambda v: q.get_job_result_bulk([v]),
    }


@pytest.mark.parametrize("value", NOT_A_STR, ids=repr)
def test_a_job_id_of_another_type_is_a_config_type_error_before_io(value: Any) -> None:
    with SyncQueue("types", redis_url=UNREACHABLE) as q:
        for label, call in _lookups(q).items():
            with pytest.raises(ConfigTypeError, match="job_id must be a str") as info:
                call(value)
            assert isinstance(info.value, TypeError), label


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"attempts": U32_MAX + 1}, "attempts"),
        ({"attempts": 10**30}, "attempts"),
        ({"backoff": U64_MAX + 1}, "backoff delay_ms"),
        ({"backoff": {"kind": "exponential", "delay_ms": 10, "max_delay_ms": 10**30}}, "backoff max_delay_ms"),
        ({"backoff": {"kind": "fixed", "delay_ms": 10, "jitter_ms": 2**64}}, "backoff jitter_ms"),
    ],
    ids=repr,
)
def test_numbers_past_their_wire_fields_are_config_errors_not_overflow(options: dict[str, Any], what: str) -> None:
    """They were ``OverflowError: Integer value out of range`` from msgpack."""
    with SyncQueue("types", redis_url=UNREACHABLE) as q:
        with pytest.raises(ConfigError, match=what):
            q.add("n", 1, **options)
        with pytest.raises(ConfigError, match=what):
            q.add_bulk([{"name": "n", "data": 1, **options}])


def test_numbers_at_their_wire_fields_limits_are_accepted(redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("n", 1, attempts=U32_MAX, backoff={"kind": "fixed", "delay_ms": 1, "jitter_ms": U64_MAX})
        assert q.get_job_state(job.id) == "waiting"  # added: waiting in the stream


@pytest.mark.parametrize(
    "window",
    [float("nan"), float("inf"), 0, -1, 0.0001, timedelta(0), timedelta(seconds=-5), timedelta(days=4000), "30"],
    ids=repr,
)
def test_a_unique_window_out_of_range_is_a_config_error(window: Any) -> None:
    """NaN raised ``ValueError``, inf ``OverflowError``; a zero or negative timedelta went to Redis."""
    with SyncQueue("types", redis_url=UNREACHABLE) as q, pytest.raises(ConfigError, match="window must be"):
        q.add_unique("n", 1, window=window)


@pytest.mark.parametrize("value", NOT_A_LIST, ids=repr)
def test_a_bulk_call_given_no_list_is_a_config_type_error(value: Any) -> None:
    """A number was ``'int' object is not iterable``; a str, bytes or a single job dict would
    have been taken item by item (letters, bytes, the dict's keys)."""
    with SyncQueue("types", redis_url=UNREACHABLE) as q:
        for what, call in (("jobs", q.add_bulk), ("specs", q.upsert_repeatable_bulk), ("dlq_ids", q.remove_dlq)):
            if what == "dlq_ids" and isinstance(value, str):
                continue  # one DLQ id given alone is accepted (it must still look like one)
            with pytest.raises(ConfigTypeError, match=what):
                call(value)


@pytest.mark.parametrize("window", [0, -1, 100_001, 1.5, "10", None, True], ids=repr)
def test_a_job_lookups_events_window_out_of_range_is_a_config_error(window: Any) -> None:
    with SyncQueue("types", redis_url=UNREACHABLE) as q, pytest.raises(ConfigError, match="events_window"):
        q.get_job_details("j", events_window=window)


def test_the_async_queue_checks_the_same_arguments() -> None:
    async def main() -> None:
        q = Queue("types", redis_url=UNREACHABLE)
        try:
            with pytest.raises(ConfigTypeError, match="job_id must be a str"):
                await q.get_job_state(5)  # type: ignore[arg-type]
            with pytest.raises(ConfigTypeError, match="jobs"):
                await q.add_bulk(5)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="attempts"):
                await q.add("n", 1, attempts=10**30)
            with pytest.raises(ConfigError, match="window must be"):
                await q.add_unique("n", 1, window=float("nan"))
            with pytest.raises(ConfigError, match="events_window"):
                await q.get_job_details("j", events_window=0)
        finally:
            await q.close()

    asyncio.run(main())


WORKER_BAD = [
    ("concurrency", 10**30),
    ("concurrency", 100_001),  # a slot is a task made at start: a million took 2 GB
    ("read_count", 10**7),
    ("read_block_ms", 10**30),
    ("claim_min_idle_ms", 10**30),
    ("result_ttl_ms", 10**30),
    ("max_attempts", 2**32),
    ("ack_idle_ms", -1),
    ("ack_idle_ms", float("nan")),
    ("ack_idle_ms", "5"),
    ("shutdown_deadline_secs", float("nan")),
    ("shutdown_deadline_secs", float("inf")),
    ("shutdown_deadline_secs", -1),
    ("shutdown_deadline_secs", "30"),
    ("sync_threads", 0),
    ("sync_threads", 1.5),
    ("sync_threads", "8"),
    ("max_jobs", 1.5),
    ("max_jobs", "5"),
    ("max_jobs", float("inf")),
    ("idle_exit_secs", float("nan")),
    ("idle_exit_secs", -1),
    ("idle_exit_secs", [1]),
    ("fail_log_window_secs", 10**30),
    ("store_results", "yes"),
    ("max_result_bytes", 0),
    ("max_result_bytes", True),
    ("max_result_bytes", 1.5),
    ("max_result_bytes", float("inf")),
    ("max_result_bytes", 512 * 1024 * 1024 + 1),  # past Redis' own limit on one argument
    ("events_enabled", 1),
    ("delayed_enabled", None),
    ("run_scheduler", [True]),
    ("result_ttl", float("nan")),
    ("result_ttl", "60"),
    ("result_ttl", timedelta(0)),
    ("fast_paths", "no"),
    ("tracing", 1),
]


@pytest.mark.parametrize(("option", "value"), WORKER_BAD, ids=repr)
def test_a_worker_option_of_a_wrong_type_or_out_of_range_is_a_config_error(option: str, value: Any) -> None:
    """Each was accepted (a NaN deadline, a str of threads, a truthy str for a bool...) or
    raised ``TypeError``/``ValueError`` from inside; ``delayed_enabled=None`` keeps its default
    (None is "the default" for every chasquimq keyword), so it is the one that must pass."""
    from airflow_provider_chasqui import Worker

    if value is None:
        Worker("q", lambda job: None, redis_url=UNREACHABLE, **{option: value})
        return
    with pytest.raises(ConfigError, match=option):
        Worker("q", lambda job: None, redis_url=UNREACHABLE, **{option: value})


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"settings": 5}, "settings must be a QueueSettings"),
        ({"settings": 0}, "settings must be a QueueSettings"),  # was taken as "no settings"
        ({"settings": {"max_stream_len": 5}}, "settings must be a QueueSettings"),
        ({"max_stream_len": 2**63}, "max_stream_len must be at most"),
        ({"fast_paths": "yes"}, "fast_paths must be True, False or None"),
        ({"tracing": 1}, "tracing must be True, False or None"),
    ],
    ids=repr,
)
def test_a_queue_constructor_refuses_wrong_settings_and_flags(options: dict[str, Any], what: str) -> None:
    for make in (Queue, SyncQueue):
        with pytest.raises(ConfigError, match=what):
            make("types", redis_url=UNREACHABLE, **options)


@pytest.mark.parametrize("limit", [2**63, 2**64, 10**30, 0, -1, True, 1.5], ids=repr)
def test_a_dlq_limit_past_a_redis_count_is_a_config_error(limit: Any) -> None:
    """``peek_dlq(2**64)`` reached Redis and came back as a ``ScriptError`` ("value is not an
    integer or out of range")."""
    with SyncQueue("types", redis_url=UNREACHABLE) as q:
        for call in (q.peek_dlq, q.replay_dlq, q.replay_dlq_report):
            with pytest.raises(ConfigError, match="limit must be a positive int up to 2"):
                call(limit)


@pytest.mark.parametrize("flag", [None, 1, "yes", [1]], ids=repr)
def test_stop_on_failure_must_be_a_bool(flag: Any) -> None:
    with (
        SyncQueue("types", redis_url=UNREACHABLE) as q,
        pytest.raises(ConfigTypeError, match="stop_on_failure must be True or False"),
    ):
        q.wait_for_results(["j"], timeout=1, stop_on_failure=flag)


BAD_URLS = [True, None, b"redis://127.0.0.1", "", "http://127.0.0.1", "redis://127.0.0.1:port", "\udcff",
            "redis://127.0.0.1:6379/abc", "redis://127.0.0.1:6379/%C2%B2",
            "redis://:s3cret@127.0.0.1:port/0"]  # fmt: skip


@pytest.mark.parametrize("url", BAD_URLS, ids=ascii)
def test_a_bad_redis_url_is_a_config_error_where_the_object_is_made(url: Any) -> None:
    """They were redis-py's ``AttributeError`` (``'bool' object has no attribute 'decode'``),
    ``TypeError`` or ``ValueError`` at the first call; ``/abc`` was db 0 without a word (redis-py
    ignores a path that is not a number). The message never shows the password."""
    makers: dict[str, Callable[[], Any]] = {
        "SyncQueue": lambda: SyncQueue("q", redis_url=url),
        "Queue": lambda: Queue("q", redis_url=url),
        "Worker": lambda: Worker("q", lambda job: None, redis_url=url),
        "QueueEvents": lambda: QueueEvents("q", redis_url=url),
    }
    for label, make in makers.items():
        with pytest.raises(ConfigError) as info:
            make()
        assert "s3cret" not in str(info.value), label
        if not isinstance(url, str):
            assert isinstance(info.value, TypeError), label


def test_the_urls_users_write_are_still_taken() -> None:
    for url in ("redis://127.0.0.1:1", "redis://127.0.0.1:1/", "redis://127.0.0.1:1/3", "rediss://h:1/0",
                "redis://:p%40ss@127.0.0.1:1/0", "unix:///tmp/r.sock?db=2", "redis://127.0.0.1:1/0?cluster=false",
                "redis+sentinel://127.0.0.1:1/mymaster/0"):  # fmt: skip
        SyncQueue("q", redis_url=url).close()


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda d: Scheduler(d, "q", tick_ms=float("nan")), "tick_ms must be a positive int"),
        (lambda d: Scheduler(d, "q", tick_ms=None), "tick_ms must be a positive int"),  # was a TypeError
        (lambda d: Scheduler(d, "q", tick_ms=0), "tick_ms must be a positive int"),
        (lambda d: Scheduler(d, "q", min_sleep_ms=-1), "min_sleep_ms must be an int from 0"),
        (lambda d: Scheduler(d, "q", lock_ttl_secs=float("inf")), "lock_ttl_secs must be a positive int"),
        (lambda d: Scheduler(d, "q", lock_ttl_secs=10**12), "lock_ttl_secs must be at most"),
        (lambda d: Scheduler(d, "q", holder="\udcff"), "holder must be text that encodes as UTF-8"),
        (lambda d: Scheduler(d, "q", holder=""), "holder must be a non-empty str"),
        (lambda d: Scheduler(d, "q", settings=True), "settings must be a QueueSettings"),
        (lambda d: Scheduler(d, "q", batch=0), "batch must be a positive int"),
        (lambda d: Promoter(d, "q", poll_interval_ms=None), "poll_interval_ms must be a positive int"),
        (lambda d: Promoter(d, "q", batch=2**64), "batch must be at most"),
        (lambda d: Promoter(d, "q", settings=True), "settings must be a QueueSettings"),  # was AttributeError
        (lambda d: Promoter(d, "q", events="yes"), "events must be True, False or None"),
        (lambda d: QueueEvents("q", driver=d, block_ms=None), "block_ms must be a positive int"),
        (lambda d: QueueEvents("q", driver=d, block_ms=0), "block_ms must be a positive int"),  # XREAD's forever
        (lambda d: QueueEvents("q", driver=d, count=0), "count must be a positive int"),
        (lambda d: Worker("q", lambda job: None, settings=True), "settings must be a WorkerSettings"),
    ],
)
def test_the_loops_arguments_are_checked_where_they_are_made(make: Callable[[Any], Any], what: str) -> None:
    """A NaN, None or out-of-range interval, TTL or count was taken and failed at the first tick
    (a ``TypeError`` in the loop, a Redis error at every lock renewal) or never."""

    async def main() -> None:
        driver = AsyncDriver(UNREACHABLE)
        try:
            with pytest.raises(ConfigError, match=what):
                make(driver)
        finally:
            await driver.close()

    asyncio.run(main())


def _no_job() -> None: ...


def _two_jobs(job: Any, other: Any) -> None: ...


async def _keyword_job(*, job: Any) -> None: ...


class _Callable:
    def __call__(self, job: Any, *, extra: int = 1) -> None: ...


def _with_spark(job: Any, spark: Any) -> None: ...


@pytest.mark.parametrize(
    ("handler", "where"),
    [
        (_no_job, "handler (_no_job()"),
        (_two_jobs, "handler (_two_jobs(job: 'Any', other: 'Any')"),
        ({"ok": lambda job: None, "resize": _keyword_job}, "handler for job name 'resize'"),
        ({"resize": _with_spark}, "handler for job name 'resize'"),
    ],
    ids=["no-parameter", "two-required", "keyword-only-job", "unbound-spark"],
)
def test_a_handler_that_cannot_take_one_job_is_refused_when_the_worker_is_made(handler: Any, where: str) -> None:
    """Such a handler raised ``TypeError`` at every job it was given, and every job of its
    name was retried and dead-lettered; now the worker is not made, naming the handler."""
    with pytest.raises(ConfigError, match=r"cannot be called with one job") as caught:
        Worker("q", handler, redis_url=UNREACHABLE)
    assert where in str(caught.value)


def test_every_handler_shape_that_takes_one_job_is_still_accepted() -> None:
    """fn(job), async fn(job), defaults, ``*args``, callable objects, bound partials and
    builtins (some of which have no signature to read) all make a worker."""
    import functools

    async def run(job: Any) -> None: ...

    shapes: list[Any] = [
        lambda job: None,
        run,
        lambda job, retries=3: None,
        lambda *args: None,
        lambda *args, **kwargs: None,
        _Callable(),
        functools.partial(_with_spark, spark=object()),
        functools.partial(_two_jobs, other=1),
        print,
        len,
    ]
    for shape in shapes:
        assert Worker("q", shape, redis_url=UNREACHABLE).settings is not None
    assert Worker("q", {f"n{i}": s for i, s in enumerate(shapes)}, redis_url=UNREACHABLE).settings is not None


@pytest.mark.parametrize("key", [5, b"key", None, "\udcff"], ids=ascii)
def test_a_sharded_queues_routing_key_of_another_type_or_no_utf8_is_a_config_error(key: Any) -> None:
    """A job id, group or spec key picks the shard by its UTF-8 bytes; a lone surrogate was a
    bare ``UnicodeEncodeError`` from ``add(job_id=...)`` and the spec lookups."""
    from airflow_provider_chasqui import SyncShardedQueue

    with SyncShardedQueue("types", 3, redis_url=UNREACHABLE) as q:
        calls: dict[str, Callable[[], Any]] = {
            "get_repeatable_job": lambda: q.get_repeatable_job(key),
            "remove_repeatable_by_key": lambda: q.remove_repeatable_by_key(key),
            "pause_repeatable": lambda: q.pause_repeatable(key),
        }
        if key is not None:  # job_id=None is "make one"
            calls["add"] = lambda: q.add("n", 1, job_id=key)
        for label, call in calls.items():
            with pytest.raises(ConfigError, match="routing key|job_id") as caught:
                call()
            assert isinstance(caught.value, TypeError) == (not isinstance(key, str)), label
