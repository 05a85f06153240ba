"""Text with no UTF-8: a ``str`` holding a lone surrogate.

Python turns bytes it cannot decode (in argv, the environment, file names) into lone
surrogates, and such a str has no UTF-8, so it can name no key, field or argument.  Every
entry point that takes a name or an id refuses one with a ``ConfigError`` naming the argument
(``core.codec.utf8_text``), before any write; a call that would still carry one (an argument
no entry point checks by name) is refused by the driver's boundary as it is packed, before it
is sent, as a ``ConfigError`` too (``drivers_common.BOUNDARY_ERRORS``), and the connection
stays usable.  A ``UnicodeEncodeError`` never reaches the caller.

Also here: the arguments of a wait (job ids, timeout) and a worker's consumer group and
consumer id, which were not checked at all (a NaN or infinite timeout raised
``ValueError``/``OverflowError``, a timeout given as a str waited forever, a str of ids was
waited for letter by letter).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from engine_support import raw_sync

from airflow_provider_chasqui import ConfigError, Queue, QueueEvents, SyncQueue, Worker
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(120)

UNREACHABLE = "redis://127.0.0.1:1/0"
LONE = ["\udcff", "a\udcffb", "\ud800", "job-\udfff", "é\udc80"]  # what undecodable bytes become
EVERY = {"kind": "every", "interval_ms": 1000}


def _no_utf8(what: str) -> str:
    return f"{what} must be text that encodes as UTF-8"


def _queue_keys(url: str, queue: str) -> list[bytes]:
    r = raw_sync(url)
    try:
        return sorted(r.scan_iter(match="{chasqui:" + queue + "}*", count=1000))
    finally:
        r.close()


@pytest.mark.parametrize("bad", LONE, ids=ascii)
def test_every_constructor_refuses_a_queue_name_without_utf8_before_io(bad: str) -> None:
    for make in (
        lambda: Queue(bad, redis_url=UNREACHABLE),
        lambda: SyncQueue(bad, redis_url=UNREACHABLE),
        lambda: Worker(bad, lambda job: None, redis_url=UNREACHABLE),
        lambda: QueueEvents(bad, redis_url=UNREACHABLE),
    ):
        with pytest.raises(ConfigError, match=_no_utf8("queue name")):
            make()


def _sync_calls(q: SyncQueue, bad: str) -> list[tuple[str, str, Callable[[], Any]]]:
    """(label, the argument the error must name, the call) for every SyncQueue method that
    takes a name or an id."""
    return [
        ("add name", "job name", lambda: q.add(bad, 1)),
        ("add delayed name", "job name", lambda: q.add(bad, 1, delay_ms=10)),
        ("add job_id", "job_id", lambda: q.add("n", 1, job_id=bad)),
        ("add group", "group", lambda: q.add("n", 1, group=bad)),
        ("add dedup_id", "dedup_id", lambda: q.add("n", 1, dedup_id=bad, dedup_ttl_ms=1000)),
        ("add_bulk name", "job name", lambda: q.add_bulk([{"name": "n", "data": 1}, {"name": bad, "data": 2}])),
        ("add_bulk job_id", "job_id", lambda: q.add_bulk([{"name": "n", "data": 1, "job_id": bad}])),
        ("add_unique job_id", "job_id", lambda: q.add_unique("n", 1, job_id=bad)),
        ("spec key", "spec key", lambda: q.upsert_repeatable_job("n", 1, repeat=EVERY, key=bad)),
        ("spec name", "job name", lambda: q.upsert_repeatable_job(bad, 1, repeat=EVERY)),
        (
            "bulk spec key",
            "spec key",
            lambda: q.upsert_repeatable_bulk([{"name": "n", "data": 1, "repeat": EVERY, "key": bad}]),
        ),
        ("cancel", "job_id", lambda: q.cancel(bad)),
        ("cancel group", "group", lambda: q.cancel("j", group=bad)),
        ("get_job_details", "job_id", lambda: q.get_job_details(bad)),
        ("get_job_state", "job_id", lambda: q.get_job_state(bad)),
        ("get_job_result", "job_id", lambda: q.get_job_result(bad)),
        ("get_failure", "job_id", lambda: q.get_failure(bad)),
        ("cancel_delayed", "job_id", lambda: q.cancel_delayed(bad)),
        ("get_job_details group", "group", lambda: q.get_job_details("j", group=bad)),
        ("inspect group", "group", lambda: q.inspect(group=bad)),
        ("get_job_result_bulk", "job_id", lambda: q.get_job_result_bulk(["j", bad])),
        ("wait_for_result", "job_id", lambda: q.wait_for_result(bad, timeout=1)),
        ("set_group_limits", "group", lambda: q.set_group_limits(concurrency=1, group=bad)),
        ("get_group_limits", "group", lambda: q.get_group_limits(bad)),
        ("clear_group_limits", "group", lambda: q.clear_group_limits(bad)),
        ("purge_dlq reason", "reason", lambda: q.purge_dlq(reason=bad)),
        ("purge_dlq name", "name", lambda: q.purge_dlq(name=bad)),
    ]


@pytest.mark.parametrize("bad", LONE[:3], ids=ascii)
def test_every_sync_call_names_the_argument_without_utf8_and_writes_nothing(
    redis_url: str, queue_name: str, bad: str
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for label, what, call in _sync_calls(q, bad):
            with pytest.raises(ConfigError, match=_no_utf8(what)):
                call()
            assert _queue_keys(redis_url, queue_name) == [], label  # refused before any write
        q.add("n", 1)  # the queue and its connection work on
    assert _queue_keys(redis_url, queue_name) != []


@pytest.mark.parametrize("bad", LONE[:3], ids=ascii)
def test_calls_no_entry_point_checks_by_name_are_refused_as_they_are_packed(
    redis_url: str, queue_name: str, bad: str
) -> None:
    """Lookups by spec key, a unique key: the driver's boundary refuses the packed call."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for call in (
            lambda: q.get_repeatable_job(bad),
            lambda: q.pause_repeatable(bad),
            lambda: q.trigger_repeatable(bad),
            lambda: q.remove_repeatable_by_key(bad),
            lambda: q.add_unique("n", 1, key=bad),
        ):
            with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
                call()
        assert q.get_job_state("nothing-here") == "unknown"
    assert _queue_keys(redis_url, queue_name) == []


async def test_the_async_twins_refuse_text_without_utf8(redis_url: str, queue_name: str) -> None:
    bad = "a\udcffb"
    q = Queue(queue_name, redis_url=redis_url)
    try:
        for what, coro in (
            ("job name", lambda: q.add(bad, 1)),
            ("job_id", lambda: q.add("n", 1, job_id=bad)),
            ("job_id", lambda: q.cancel(bad)),
            ("job_id", lambda: q.wait_for_result(bad, timeout=1)),
            ("job_id", lambda: q.wait_for_results(["j", bad], timeout=1)),
            ("group", lambda: q.inspect(group=bad)),
        ):
            with pytest.raises(ConfigError, match=_no_utf8(what)):
                await coro()
        with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
            await q.get_repeatable_job(bad)
        job = await q.add("n", 1)  # the coalesced adds and the connection work on
        assert job.id
    finally:
        await q.close()


@pytest.mark.parametrize("bad", LONE[:2], ids=ascii)
def test_the_drivers_refuse_an_argument_without_utf8_and_stay_usable(redis_url: str, bad: str) -> None:
    sync = SyncDriver(redis_url)
    try:
        for args in (("GET", "{chasqui:x}:" + bad), ("ECHO", bad)):
            with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
                sync.call(command(*args))
            with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
                sync.pipeline([command("PING"), command(*args)])
        assert sync.call(command("ECHO", "still here")) == b"still here"
    finally:
        sync.close()

    async def main() -> None:
        drv = AsyncDriver(redis_url)
        try:
            with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
                await drv.call(command("ECHO", bad))
            with pytest.raises(ConfigError, match="not text that encodes as UTF-8"):
                await drv.pipeline([command("PING"), command("ECHO", bad)])
            assert await drv.call(command("ECHO", "still here")) == b"still here"
        finally:
            await drv.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "options",
    [
        {"group": "a\udcffb"},
        {"group": ""},
        {"group": 5},
        {"group": "g" * 257},
        {"consumer_id": "c\udcff"},
        {"consumer_id": ""},
        {"consumer_id": 7},
    ],
    ids=ascii,
)
def test_a_worker_refuses_a_bad_consumer_group_or_id(options: dict[str, Any]) -> None:
    what = next(iter(options))
    with pytest.raises(ConfigError, match=what):
        Worker("q", lambda job: None, redis_url=UNREACHABLE, **options)


@pytest.mark.parametrize("key", ["a\udcffb", 5, None, b"n"], ids=ascii)
def test_a_worker_refuses_a_handler_table_key_no_job_name_can_equal(key: Any) -> None:
    with pytest.raises(ConfigError, match="job name"):
        Worker("q", {"n": lambda job: None, key: lambda job: None}, redis_url=UNREACHABLE)


@pytest.mark.parametrize(
    ("job_ids", "timeout", "what"),
    [
        (["j"], float("nan"), "timeout"),
        (["j"], float("inf"), "timeout"),
        (["j"], -1, "timeout"),
        (["j"], "1", "timeout"),  # "1" * 1000 was a wait of 10**999 ms
        (["j"], None, "timeout"),
        (["j"], True, "timeout"),
        (["j"], 1e308, "timeout"),  # finite, but OverflowError converting to ms
        (["j"], 2**64, "timeout"),  # waited 584 million years
        ("abc", 1, "job_ids"),  # was a wait for "a", "b" and "c"
        (b"abc", 1, "job_ids"),
        (5, 1, "job_ids"),
        ([5], 1, "job_id"),
        ([None], 1, "job_id"),
        ([""], 1, "job_id"),
        (["x" * 1025], 1, "job_id"),
    ],
    ids=ascii,
)
def test_a_wait_refuses_bad_ids_and_timeouts_at_once(
    redis_url: str, queue_name: str, job_ids: Any, timeout: Any, what: str
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=what):
            q.wait_for_results(job_ids, timeout=timeout)
        assert time.monotonic() - started < 5

    async def main() -> None:
        aq = Queue(queue_name, redis_url=redis_url)
        try:
            with pytest.raises(ConfigError, match=what):
                await asyncio.wait_for(aq.wait_for_results(job_ids, timeout=timeout), 5)
        finally:
            await aq.close()

    asyncio.run(main())


def test_a_wait_of_zero_seconds_looks_once(redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("n", 1)
        started = time.monotonic()
        assert q.wait_for_results([job.id], timeout=0) == {}  # nothing ended it: absent, at once
        assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "-H", "airflow_provider_chasqui.examples.handlers", "--queue", b"a\xffb", "--idle-exit", "1"],
        ["worker", "-H", "airflow_provider_chasqui.examples.handlers", "--queue", "q", "--group", b"g\xff"],
        ["job", "show", b"j\xff", "--queue", "q"],
        ["job", "cancel", b"j\xff", "--queue", "q"],
        ["inspect", b"a\xffb"],
        ["queues", "--match", b"a\xff*"],
    ],
    ids=lambda a: " ".join(x if isinstance(x, str) else ascii(x) for x in a[:3]),
)
def test_the_cli_names_undecodable_arguments_without_a_traceback(redis_url: str, args: list[str | bytes]) -> None:
    """Arguments as a shell passes undecodable bytes: exit 2 (a usage error) or 1, the
    argument named, no traceback."""
    argv = [os.fsencode(sys.executable), b"-m", b"airflow_provider_chasqui.cli"]
    argv += [a if isinstance(a, bytes) else a.encode() for a in args]
    env = {**os.environ, "CHASQUI_REDIS_URL": redis_url, "PYTHONUTF8": "0", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run(argv, capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (1, 2), (proc.returncode, err)
    assert "Traceback" not in err and "UnicodeEncodeError" not in err, err
    assert "must be text that encodes as UTF-8" in err, err


def test_redis_py_itself_would_have_raised_unicode_encode_error(redis_url: str) -> None:
    """Why the boundary catches it: redis-py's encoder lets the error out as it is."""
    r = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(UnicodeEncodeError):
            r.echo("a\udcffb")
    finally:
        r.close()
