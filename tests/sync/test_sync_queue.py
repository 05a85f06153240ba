"""``SyncQueue`` against the shared Redis: it writes exactly what ``Queue`` writes and waits
for results the same way, from plain threads without an event loop (as Airflow hooks do)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import msgpack
import pytest
import redis
from engine_support import kv, wait_until_sync

from airflow_provider_chasqui import (
    ConfigError,
    Job,
    JobFailed,
    Queue,
    SyncQueue,
    UnrecoverableError,
    Worker,
)
from airflow_provider_chasqui.core.codec import decode_envelope, split_member
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ChasquiConnectionError


@pytest.fixture
def r(redis_url) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture
def sq(redis_url, queue_name) -> Iterator[SyncQueue]:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        yield q
    assert q.is_closed


@contextlib.contextmanager
def worker_thread(queue: str, handler, url: str, **kw) -> Iterator[Worker]:
    """An asyncio Worker on its own loop in a thread; closed and drained on exit."""
    kw.setdefault("run_scheduler", False)
    w = Worker(queue, handler, redis_url=url, **kw)
    loop = asyncio.new_event_loop()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            loop.run_until_complete(w.run())
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    t = threading.Thread(target=main, name="test-worker-loop")
    t.start()
    try:
        yield w
    finally:
        wait_until_sync(lambda: w.is_running or not t.is_alive(), what="worker started")
        asyncio.run_coroutine_threadsafe(w.close(), loop).result(10)
        t.join(30)
        loop.close()
        assert not t.is_alive()
        assert not errors, errors


def _entries(r, k):
    return [kv(f) for _id, f in r.xrange(k.stream)]


def test_sync_add_writes_what_the_async_queue_writes(redis_url, queue_name, r, sq) -> None:
    k = QueueKeys.for_queue(queue_name)
    job = sq.add("send-email", {"to": "ada"}, attempts=3, backoff=500)
    assert isinstance(job, Job) and job.name == "send-email" and job.attempt == 0

    async def via_async() -> Job:
        async with Queue(queue_name, redis_url=redis_url) as q:
            return await q.add("send-email", {"to": "ada"}, attempts=3, backoff=500)

    other = asyncio.run(via_async())
    (a_fields, b_fields) = _entries(r, k)
    assert [n for n, _ in a_fields] == [n for n, _ in b_fields] == ["d", "n"]
    a, b = decode_envelope(a_fields[0][1]), decode_envelope(b_fields[0][1])
    assert (a.id, b.id) == (job.id, other.id)
    assert (a.inner, a.attempt, a.retry) == (b.inner, b.attempt, b.retry)
    assert msgpack.unpackb(a.inner) == {"to": "ada"}


def test_sync_delayed_bulk_unique_and_cancel(queue_name, r, sq) -> None:
    k = QueueKeys.for_queue(queue_name)
    later = sq.add("later", 1, delay=timedelta(minutes=5), job_id="s-later")
    assert later.id == "s-later" and sq.get_job_state("s-later") == "delayed"
    assert sq.add("later", 2, delay=timedelta(minutes=5), job_id="s-later").id == "s-later"
    ((member, _score),) = r.zrange(k.delayed, 0, -1, withscores=True)
    assert split_member(member)[0] == "later"
    assert sq.cancel_delayed("s-later") is True and sq.cancel_delayed("s-later") is False
    jobs = sq.add_bulk([{"name": "b", "data": i} for i in range(5)] + [{"name": "d", "data": 9, "delay": 60_000}])
    assert [j.data for j in jobs] == [0, 1, 2, 3, 4, 9]
    assert r.xlen(k.stream) == 5 and r.zcard(k.delayed) == 1
    first = sq.add_unique("u", {"x": 1}, window=30)
    assert sq.add_unique("u", {"x": 1}, window=30).id == first.id
    assert r.xlen(k.stream) == 6


def test_sync_bad_input_is_rejected_before_io() -> None:
    q = SyncQueue("bad-input", redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError):
        q.add("n" * 257, {})
    with pytest.raises(ConfigError):
        q.add("j", object())
    with pytest.raises(ConfigError):
        q.add("j", {}, delay=-1)
    with pytest.raises(TypeError):
        q.add("j", {}, delay=True)
    with pytest.raises(ConfigError):
        q.add("j", {}, backoff={"kind": "linear", "delay_ms": 1})
    with pytest.raises(ConfigError):
        SyncQueue("a{b}")
    q.close()


def test_sync_results_and_waiting(redis_url, queue_name, sq) -> None:
    release = threading.Event()

    def handler(job: Job):
        if job.data == "fatal":
            raise UnrecoverableError("no")
        if job.data == "slow":
            release.wait(20)
        return {"echo": job.data}

    with worker_thread(queue_name, handler, redis_url, store_results=True):
        ok = sq.add("echo", "hi")
        assert sq.wait_for_result(ok.id, timeout=20) == {"echo": "hi"}
        assert sq.get_job_result(ok.id) == {"echo": "hi"}
        assert sq.get_job_state(ok.id) == "completed"
        bad = sq.add("echo", "fatal")
        with pytest.raises(JobFailed) as info:
            sq.wait_for_result(bad.id, timeout=20)
        assert info.value.reason == "unrecoverable"
        assert sq.get_job_state(bad.id) == "failed"
        failure = sq.get_failure(bad.id)  # the blocking twin of Queue.get_failure
        assert failure.reason == "unrecoverable" and failure.traceback == info.value.traceback
        assert failure.traceback.startswith("Traceback (most recent call last):")
        slow = sq.add("echo", "slow")
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            sq.wait_for_result(slow.id, timeout=0.3)
        assert 0.25 <= time.monotonic() - start < 3
        release.set()
        assert sq.wait_for_result(slow.id, timeout=20) == {"echo": "slow"}
        outcomes = sq.wait_for_results([ok.id, bad.id], timeout=5)
        assert outcomes[ok.id] == ("completed", {"echo": "hi"}) and outcomes[bad.id][:2] == ("failed", "unrecoverable")


def test_sync_dlq_peek_and_replay(redis_url, queue_name, r, sq) -> None:
    k = QueueKeys.for_queue(queue_name)
    healthy = threading.Event()
    attempts: list[int] = []

    def handler(job: Job) -> None:
        attempts.append(job.attempt)
        if not healthy.is_set():
            raise ValueError("down")

    with worker_thread(queue_name, handler, redis_url):
        job = sq.add("flaky", 1, attempts=1)
        wait_until_sync(lambda: r.xlen(k.dlq) == 1, what="dead letter")
        (entry,) = sq.peek_dlq()
        assert (entry["reason"], entry["name"], decode_envelope(entry["payload"]).id) == (
            "retries_exhausted",
            "flaky",
            job.id,
        )
        healthy.set()
        assert sq.replay_dlq() == 1
        wait_until_sync(lambda: len(attempts) == 2, what="the replayed run")
    assert attempts == [0, 0]
    assert r.xlen(k.dlq) == 0


def test_one_sync_queue_shared_by_threads(queue_name, r, sq) -> None:
    k = QueueKeys.for_queue(queue_name)
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: sq.add("t", i).id, range(200)))
    assert len(set(ids)) == 200
    assert r.xlen(k.stream) == 200


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0?cluster=true"], ids=["single", "cluster"]
)
def test_sync_queue_on_an_unreachable_server_says_so(url: str) -> None:
    """Nothing listens on port 1: one clear connection error, for a server and for a cluster."""
    with SyncQueue("t-unreachable", redis_url=url) as q, pytest.raises(ChasquiConnectionError, match="unreachable"):
        q.add("a", 1)
