"""Event-driven scheduling: ``MessageQueueTrigger(scheme="chasqui")`` asset watchers.

* the trigger's serialization and the common-messaging provider discovery;
* both producers against the shared Redis: queue mode acknowledges only in ``advance`` and
  re-reads what a crashed watcher left pending (the crash is a SIGKILLed process), completion
  mode keeps its cursor in Redis and resumes without replay or skip;
* the ack gate through Airflow's real ``SharedStreamManager``, driven the way the triggerer
  drives it (subscribe, ``filter_shared_stream``, ``bind_pending_event``, ``confirm_persisted``);
* end to end with the real scheduler, dag-processor, triggerer and api-server on a private
  AIRFLOW_HOME (sqlite): unpause the example DAGs of ``example_dags/event_driven.py``, enqueue,
  see the runs (both modes); then SIGKILL the triggerer, enqueue while it is down, start a new
  one and see exactly one more run per DAG.

Completion events come from a real in-process ``Worker``; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from airflow.sdk.serde import deserialize, serialize
from cryptography.fernet import Fernet
from airflow.triggers.base import TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome, SharedStreamManager

from airflow_provider_chasqui import Queue, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.examples.handlers import HANDLERS
from airflow_provider_chasqui.queues.chasqui import ChasquiMessageQueueProvider
from airflow_provider_chasqui.triggers.queue_events import (
    WATCHER_CONSUMER,
    ChasquiQueueEventTrigger,
    CompletedJob,
    CompletionModeProducer,
    QueueJob,
    QueueModeProducer,
    default_cursor,
)
from airflow_support import WorkerProcess, conn_json, delete_queue_keys, stop_services
from engine_support import running, wait_until
from redis_topologies import free_port

CLEAN = AdvanceOutcome(acked=1, failed=0)
FAILED = AdvanceOutcome(acked=0, failed=1)
NOBODY = AdvanceOutcome(acked=0, failed=0)
REJECTED = AdvanceOutcome(acked=0, failed=0, rejected=1)
CLASSPATH = "airflow_provider_chasqui.triggers.queue_events.ChasquiQueueEventTrigger"


def _import(classpath: str) -> type:
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _r(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


class Reader:
    """A producer's ``open_stream()`` read the way the shared-stream manager reads it, one item
    at a time; a read still waiting (``nothing_within``) is the one the next ``take`` gets."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.stream = producer.open_stream()
        self._next: asyncio.Future | None = None

    def _pending(self) -> asyncio.Future:
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self.stream))
        return self._next

    async def take(self, n: int, timeout: float = 15.0) -> list[Any]:
        out = []
        for _ in range(n):
            done, _ = await asyncio.wait({self._pending()}, timeout=timeout)
            assert done, f"timed out after {timeout}s waiting for item {len(out) + 1} of {n}"
            out.append(self._next.result())
            self._next = None
        return out

    async def nothing_within(self, seconds: float) -> None:
        waiting = self._pending()
        await asyncio.sleep(seconds)
        assert not waiting.done(), waiting.result()

    async def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._next
        await self.stream.aclose()
        await self.producer.aclose()


@contextlib.asynccontextmanager
async def reading(producer: Any) -> AsyncIterator[Reader]:
    reader = Reader(producer)
    try:
        yield reader
    finally:
        await reader.close()


def sid(value: str | bytes | None) -> tuple[int, int]:
    """A stream id as a comparable tuple (``b"10-2" < b"9-3"`` as strings)."""
    if value is None:
        return (-1, -1)
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq)


def pending(url: str, queue: str) -> int:
    try:
        return _r(url).xpending(QueueKeys.for_queue(queue).stream, "default")["pending"]
    except redis.ResponseError:
        return 0


def events(url: str, queue: str, kind: str | None = None) -> list[dict[str, str]]:
    rows = _r(url).xrange(QueueKeys.for_queue(queue).events)
    out = [{k.decode(): v.decode() for k, v in fields.items()} | {"_id": eid.decode()} for eid, fields in rows]
    return [e for e in out if kind is None or e["e"] == kind]


# ---- the trigger itself ----------------------------------------------------------------------------
CASES = [
    {"queue_name": "files"},
    {"queue_name": "files", "job_names": ["b", "a"], "chasqui_conn_id": "other"},
    {"queue_name": "ünïcode queue", "mode": "completion", "job_names": ["square"]},
    {"queue_name": "reports", "mode": "completion", "cursor": "nightly", "job_names": None},
]


@pytest.mark.parametrize("kwargs", CASES)
def test_serialize_round_trip(kwargs: dict) -> None:
    trigger = ChasquiQueueEventTrigger(**kwargs)
    classpath, data = trigger.serialize()
    assert classpath == CLASSPATH and _import(classpath) is ChasquiQueueEventTrigger
    assert set(data) == set(inspect.signature(ChasquiQueueEventTrigger).parameters)  # exactly the __init__ args
    assert json.loads(json.dumps(data)) == data
    revived = _import(classpath)(**deserialize(serialize(data)))  # what the triggerer does
    assert revived.serialize() == (classpath, data)
    assert revived.shared_stream_key() == trigger.shared_stream_key()
    assert data["job_names"] == (sorted(kwargs["job_names"]) if kwargs.get("job_names") else None)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"queue_name": "a{b}"}, "hash tag"),
    ({"queue_name": ""}, "empty"),
    ({"queue_name": "q", "mode": "completed"}, "mode must be one of"),
    ({"queue_name": "q", "cursor": "c"}, "only applies to mode='completion'"),
    ({"queue_name": "q", "mode": "completion", "cursor": "a}b"}, "cursor must be"),
    ({"queue_name": "q", "job_names": []}, "job_names"),
    ({"queue_name": "q", "job_names": "square"}, "job_names"),
    ({"queue_name": "q", "job_names": ["", "x"]}, "job_names"),
    ({"queue_name": "q", "chasqui_conn_id": ""}, "chasqui_conn_id"),
])
def test_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChasquiQueueEventTrigger(**kwargs)


def test_shared_stream_keys_and_cursors() -> None:
    a = ChasquiQueueEventTrigger(queue_name="q", job_names=["a"])
    b = ChasquiQueueEventTrigger(queue_name="q")
    assert a.shared_stream_key() == b.shared_stream_key() == ("chasqui", "queue", "chasqui_default", "q")
    assert a.cursor_name is None
    c = ChasquiQueueEventTrigger(queue_name="q", mode="completion", job_names=["square", "greet"])
    assert c.cursor_name == "airflow:greet,square" == default_cursor(["greet", "square"])
    assert c.shared_stream_key() == ("chasqui", "completion", "chasqui_default", "q", "airflow:greet,square")
    assert ChasquiQueueEventTrigger(queue_name="q", mode="completion").cursor_name == "airflow:*"
    long = default_cursor([f"job-{i:03d}" for i in range(30)])
    assert long.startswith("airflow:") and len(long) == len("airflow:") + 16


def test_decide() -> None:
    trigger = ChasquiQueueEventTrigger(queue_name="q", job_names=["file_arrived"])
    job = QueueJob("q", b"1-0", "J1", "file_arrived", {"path": "/in/a.csv"}, 1, 123, b"raw")
    event = trigger.decide(job)
    assert isinstance(event, TriggerEvent)
    assert event.payload == {"mode": "queue", "queue": "q", "job_id": "J1", "name": "file_arrived",
                             "data": {"path": "/in/a.csv"}, "attempt": 1, "created_at_ms": 123, "entry_id": "1-0"}
    assert deserialize(serialize(event.payload)) == event.payload
    other = QueueJob("q", b"1-1", "J2", "resize", {}, 1, 123, b"raw")
    assert trigger.decide(other) == "job name 'resize' is not watched (watching file_arrived)"
    binary = QueueJob("q", b"1-2", "J3", "file_arrived", {"blob": b"\x00"}, 1, 123, b"raw")
    assert trigger.decide(binary) == "data['blob'] is a bytes: an asset event carries JSON-compatible data only"

    completion = ChasquiQueueEventTrigger(queue_name="q", mode="completion", job_names=["square"])
    done = CompletedJob("q", "5-0", "completed", "J4", "square", 77, {"attempt": "1", "duration_us": "12"})
    event = completion.decide(done)
    assert isinstance(event, TriggerEvent) and event.payload == {
        "mode": "completion", "queue": "q", "event": "completed", "job_id": "J4", "name": "square", "ts_ms": 77,
        "event_id": "5-0", "attempt": 1, "duration_us": 12}
    assert completion.decide(CompletedJob("q", "5-1", "active", "J4", "square", 77, {})) is None
    assert completion.decide(CompletedJob("q", "5-2", "completed", "J5", "greet", 77, {})) is None


# ---- common-messaging discovery -------------------------------------------------------------------
def test_message_queue_trigger_resolves_to_the_chasqui_trigger() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk import Asset, AssetWatcher

    assert "airflow_provider_chasqui.queues.chasqui.ChasquiMessageQueueProvider" in \
        ProvidersManager().queue_class_names
    mqt = MessageQueueTrigger(scheme="chasqui", queue_name="files", mode="completion", job_names=["square"],
                              cursor="nightly")
    assert isinstance(mqt.trigger, ChasquiQueueEventTrigger)
    assert mqt.serialize() == (CLASSPATH, {"queue_name": "files", "mode": "completion", "job_names": ["square"],
                                           "chasqui_conn_id": "chasqui_default", "cursor": "nightly"})
    asset = Asset("chasqui_files", watchers=[AssetWatcher(name="w", trigger=mqt)])
    assert asset.watchers[0].trigger is mqt
    provider = ChasquiMessageQueueProvider()
    assert provider.scheme_matches("chasqui") and not provider.scheme_matches("redis+pubsub")
    assert provider.trigger_class() is ChasquiQueueEventTrigger


def test_uri_form() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    with pytest.warns(DeprecationWarning, match="queue"):
        mqt = MessageQueueTrigger(queue="chasqui://etl_redis/in%2Ffiles?job_names=a,b&job_names=c")
    assert mqt.serialize()[1] == {"queue_name": "in/files", "mode": "queue", "job_names": ["a", "b", "c"],
                                  "chasqui_conn_id": "etl_redis", "cursor": None}
    provider = ChasquiMessageQueueProvider()
    assert provider.queue_matches("chasqui:///q") and not provider.queue_matches("redis+pubsub://x")
    assert provider.trigger_kwargs("chasqui:///reports?mode=completion&cursor=nightly") == {
        "queue_name": "reports", "mode": "completion", "cursor": "nightly"}
    for bad, match in [("chasqui://conn/", "names no queue"), ("chasqui:///q?colour=red", "unknown chasqui URI"),
                       ("chasqui:///q?mode=queue&mode=completion", "given 2 times"), ("kafka:///q", "not a chasqui")]:
        with pytest.raises(ValueError, match=match):
            provider.trigger_kwargs(bad)
    with pytest.raises(ValueError, match="both in the URI"):
        provider.trigger_kwargs("chasqui:///q?mode=completion", mode="queue")


# ---- queue mode against Redis ---------------------------------------------------------------------
def queue_producer(queue: str, **kwargs: Any) -> QueueModeProducer:
    return QueueModeProducer(queue_name=queue, chasqui_conn_id="chasqui_default", **kwargs)


async def add_jobs(url: str, queue: str, *jobs: tuple[str, Any], **kwargs: Any) -> list[str]:
    async with Queue(queue, redis_url=url) as q:
        return [(await q.add(name, data, **kwargs)).id for name, data in jobs]


async def test_queue_entries_are_acknowledged_only_in_advance(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(3)])
    async with reading(queue_producer(queue_name)) as rd:
        producer = rd.producer
        got = await rd.take(3)
        assert [raw.job_id for raw, _ in got] == ids and all(raw is payload for raw, payload in got)
        assert [raw.payload()["data"] for raw, _ in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
        info = _r(redis_url).xpending(producer.keys.stream, "default")
        assert info["pending"] == 3 and info["consumers"] == [{"name": WATCHER_CONSUMER.encode(), "pending": 3}]
        await rd.nothing_within(0.3)  # read, not acknowledged: still all there
        assert _r(redis_url).xlen(producer.keys.stream) == 3 and pending(redis_url, queue_name) == 3
        await producer.advance([AdvanceItem(payload, CLEAN) for _, payload in got])
        assert _r(redis_url).xlen(producer.keys.stream) == 0 and pending(redis_url, queue_name) == 0
        assert [e["id"] for e in events(redis_url, queue_name, "completed")] == ids
        assert producer.acked_total == 3


CRASHING_WATCHER = textwrap.dedent("""
    import asyncio, sys
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome
    from airflow_provider_chasqui.triggers.queue_events import QueueModeProducer

    async def main(queue):
        producer = QueueModeProducer(queue_name=queue, chasqui_conn_id="chasqui_default")
        stream = producer.open_stream()
        got = [await anext(stream) for _ in range(3)]
        await producer.advance([AdvanceItem(got[0][1], AdvanceOutcome(acked=1, failed=0))])
        print("READ", " ".join(raw.job_id for raw, _ in got), flush=True)
        await asyncio.sleep(600)  # SIGKILLed here: two entries read, never acknowledged

    asyncio.run(main(sys.argv[1]))
""")


async def test_a_crashed_watcher_loses_nothing(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """SIGKILL a watcher process after it read 3 jobs and acknowledged 1: the next watcher
    re-reads exactly the other 2 (as new deliveries) before new jobs; the acknowledged one is gone."""
    ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(3)])
    script = tmp_path / "watcher.py"
    script.write_text(CRASHING_WATCHER)
    log = tmp_path / "watcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), queue_name], stdout=out, stderr=subprocess.STDOUT)
    try:
        await wait_until(lambda: "READ" in log.read_text() or proc.poll() is not None, 60, what="the watcher",
                         interval=0.05)
        assert f"READ {' '.join(ids)}" in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert pending(redis_url, queue_name) == 2 and _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 2
    later = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 3}))

    async with reading(queue_producer(queue_name)) as rd:
        got = await rd.take(3)
        assert [(raw.job_id, raw.attempt) for raw, _ in got] == [(ids[1], 2), (ids[2], 2), (later[0], 1)]
        await rd.producer.advance([AdvanceItem(payload, CLEAN) for _, payload in got])
        await rd.nothing_within(0.5)
        assert pending(redis_url, queue_name) == 0 and _r(redis_url).xlen(rd.producer.keys.stream) == 0
        assert sorted(e["id"] for e in events(redis_url, queue_name, "completed")) == sorted(ids + later)


async def test_refused_jobs_go_to_the_dlq_with_a_reason(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, ("resize", {"w": 1}), ("file_arrived", {"p": "x"}))
    async with reading(queue_producer(queue_name)) as rd:
        producer = rd.producer
        (refused, _), (mixed, _) = await rd.take(2)
        refused.reject_reasons.append("job name 'resize' is not watched (watching file_arrived)")
        mixed.reject_reasons.append("not mine")
        await producer.advance([AdvanceItem(refused, REJECTED),
                                AdvanceItem(mixed, AdvanceOutcome(acked=1, failed=0, rejected=1))])
        dlq = _r(redis_url).xrange(producer.keys.dlq)
        assert len(dlq) == 1
        fields = {k.decode(): v for k, v in dlq[0][1].items()}
        assert fields["reason"] == b"unrecoverable" and fields["n"] == b"resize"
        assert fields["source_id"] == refused.entry_id and fields["d"] == refused.raw
        assert fields["detail"] == b"job name 'resize' is not watched (watching file_arrived)"
        assert [e["id"] for e in events(redis_url, queue_name, "dlq")] == [ids[0]]
        assert [e["id"] for e in events(redis_url, queue_name, "completed")] == [ids[1]]  # another watcher took it
        assert pending(redis_url, queue_name) == 0 and _r(redis_url).xlen(producer.keys.stream) == 0
        async with Queue(queue_name, redis_url=redis_url) as q:
            assert await q.get_job_state(ids[0]) == "failed"
            assert (await q.peek_dlq())[0]["reason"] == "unrecoverable"


async def test_failed_or_unreceived_entries_are_redelivered(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, ("a", 1), ("b", 2), ("c", 3))
    async with reading(queue_producer(queue_name, redeliver_after_ms=200)) as rd:
        got = await rd.take(3)
        started = time.monotonic()
        await rd.producer.advance([AdvanceItem(got[0][1], FAILED), AdvanceItem(got[1][1], CLEAN),
                                   AdvanceItem(got[2][1], NOBODY)])
        again = await rd.take(2)
        assert time.monotonic() - started >= 0.15
        assert sorted((raw.job_id, raw.attempt) for raw, _ in again) == sorted([(ids[0], 2), (ids[2], 2)])
        assert pending(redis_url, queue_name) == 2
        await rd.producer.advance([AdvanceItem(payload, CLEAN) for _, payload in again])
        await rd.nothing_within(0.5)
        assert pending(redis_url, queue_name) == 0 and _r(redis_url).xlen(rd.producer.keys.stream) == 0


async def test_attempts_bound_the_redeliveries(redis_url: str, queue_name: str) -> None:
    """A job whose watchers keep failing is delivered ``attempts`` times, then dead-lettered."""
    [job_id] = await add_jobs(redis_url, queue_name, ("file_arrived", {}), attempts=2)
    async with reading(queue_producer(queue_name, redeliver_after_ms=100)) as rd:
        for attempt in (1, 2):
            [(raw, payload)] = await rd.take(1)
            assert (raw.job_id, raw.attempt) == (job_id, attempt)
            await rd.producer.advance([AdvanceItem(payload, FAILED)])
        await rd.nothing_within(0.1)  # the third delivery is refused by the arrival gate
        await wait_until(lambda: _r(redis_url).xlen(rd.producer.keys.dlq) == 1, 10, what="the dead letter")
        await rd.nothing_within(0.3)
        [(_, fields)] = _r(redis_url).xrange(rd.producer.keys.dlq)
        assert fields[b"reason"] == b"retries_exhausted" and pending(redis_url, queue_name) == 0


async def test_arrival_gate_delayed_jobs_and_dead_consumers(redis_url: str, queue_name: str) -> None:
    """Malformed entries are dead-lettered on arrival; delayed jobs are promoted by the watcher;
    an entry left pending by another (dead) consumer is claimed once idle long enough."""
    keys = QueueKeys.for_queue(queue_name)
    r = _r(redis_url)
    r.xgroup_create(keys.stream, "default", id="0", mkstream=True)
    r.xadd(keys.stream, {"x": "y"})  # no payload field
    [orphan] = await add_jobs(redis_url, queue_name, ("file_arrived", {"orphan": True}))
    r.xreadgroup("default", "dead-worker", {keys.stream: ">"}, count=2)  # both pending for a dead consumer
    [delayed] = await add_jobs(redis_url, queue_name, ("file_arrived", {"later": True}), delay_ms=300)
    async with reading(queue_producer(queue_name, claim_min_idle_ms=400)) as rd:
        got = await rd.take(2)
        assert sorted((raw.job_id, raw.attempt) for raw, _ in got) == sorted([(orphan, 2), (delayed, 1)])
        [(_, fields)] = r.xrange(keys.dlq)
        assert fields[b"reason"] == b"malformed" and fields[b"detail"] == b"missing or non-bytes payload field"
        await rd.producer.advance([AdvanceItem(payload, CLEAN) for _, payload in got])
        assert pending(redis_url, queue_name) == 0 and r.xlen(keys.stream) == 0 and r.zcard(keys.delayed) == 0


async def test_standalone_run_acknowledges_when_the_next_event_is_asked_for(redis_url: str,
                                                                             queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 1}), ("resize", {}),
                         ("file_arrived", {"n": 2}))
    trigger = ChasquiQueueEventTrigger(queue_name=queue_name, job_names=["file_arrived"])
    run = trigger.run()
    try:
        first = await asyncio.wait_for(anext(run), 15)
        assert first.payload["job_id"] == ids[0] and pending(redis_url, queue_name) == 3
        second = await asyncio.wait_for(anext(run), 15)  # acknowledges the first, refuses "resize"
        assert second.payload["job_id"] == ids[2]
        assert pending(redis_url, queue_name) == 1
        [(_, fields)] = _r(redis_url).xrange(QueueKeys.for_queue(queue_name).dlq)
        assert fields[b"n"] == b"resize" and b"is not watched" in fields[b"detail"]
    finally:
        await run.aclose()  # closes the stream and the producer's client (the generator's finally)
    assert pending(redis_url, queue_name) == 1  # the last one was never acknowledged: redelivered later


async def test_queue_mode_on_every_server(matrix_url: Any, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Acknowledge (XACK + XDEL, or XACKDEL where the server has it), dead-letter and redeliver
    on Redis 7.0, Valkey 8.1 and Redis 8.2, fast paths on and off."""
    monkeypatch.setenv("AIRFLOW_CONN_CHASQUI_MATRIX", conn_json(matrix_url.url))
    monkeypatch.setenv("CHASQUI_FAST_PATHS", "0" if matrix_url.force_compat else "1")
    ids = await add_jobs(matrix_url.url, queue_name, ("a", 1), ("b", 2), ("c", 3))
    keys = QueueKeys.for_queue(queue_name)
    first = QueueModeProducer(queue_name=queue_name, chasqui_conn_id="chasqui_matrix")
    async with reading(first) as rd:
        got = await rd.take(3)
        got[1][0].reject_reasons.append("no")
        await first.advance([AdvanceItem(got[0][1], CLEAN), AdvanceItem(got[1][1], REJECTED)])
        assert (await first._queue.driver.features()).xackdel == (
            matrix_url.kind == "redis82" and not matrix_url.force_compat)
    r = _r(matrix_url.url)
    assert r.xlen(keys.stream) == 1 and r.xlen(keys.dlq) == 1 and pending(matrix_url.url, queue_name) == 1
    second = QueueModeProducer(queue_name=queue_name, chasqui_conn_id="chasqui_matrix")
    async with reading(second) as rd:
        [(raw, payload)] = await rd.take(1)
        assert (raw.job_id, raw.attempt) == (ids[2], 2)
        await second.advance([AdvanceItem(payload, CLEAN)])
    assert r.xlen(keys.stream) == 0 and pending(matrix_url.url, queue_name) == 0
    assert [e["id"] for e in events(matrix_url.url, queue_name, "completed")] == [ids[0], ids[2]]


# ---- completion mode against Redis ----------------------------------------------------------------
def completion_producer(queue: str, cursor: str = "airflow:square", **kwargs: Any) -> CompletionModeProducer:
    return CompletionModeProducer(queue_name=queue, chasqui_conn_id="chasqui_default", cursor=cursor, **kwargs)


def make_worker(queue: str, url: str) -> Worker:
    return Worker(queue, HANDLERS, redis_url=url, run_scheduler=False, read_block_ms=500, store_results=True)


async def complete(url: str, queue: str, *xs: int) -> list[str]:
    """Run ``square`` jobs through a real worker; return their ids once all completed."""
    ids = await add_jobs(url, queue, *[("square", {"x": x}) for x in xs])
    await wait_until(lambda: {e["id"] for e in events(url, queue, "completed")} >= set(ids), 15,
                     what="the jobs to complete", interval=0.02)
    return ids


async def completed_of(rd: Reader, job_ids: list[str]) -> list[CompletedJob]:
    """Raw events up to and including the ``completed`` ones of ``job_ids`` (in stream order)."""
    out = []
    want = set(job_ids)
    while want:
        [(raw, event_id)] = await rd.take(1)
        assert raw.event_id == event_id
        out.append(raw)
        if raw.event == "completed":
            want.discard(raw.job_id)
    return out


async def test_completion_cursor_resumes_without_replay_or_skip(redis_url: str, queue_name: str) -> None:
    worker = make_worker(queue_name, redis_url)
    cursor_key = QueueKeys.for_queue(queue_name).cursor("airflow:square")
    async with running(worker):
        [before] = await complete(redis_url, queue_name, 1)
        last_before = events(redis_url, queue_name)[-1]["_id"]

        async with reading(completion_producer(queue_name)) as rd:
            await rd.nothing_within(0.3)  # the cursor starts at the end: no replay of older events
            assert _r(redis_url).get(cursor_key) == last_before.encode()
            j1, j2, j3 = await complete(redis_url, queue_name, 2, 3, 4)
            raws = await completed_of(rd, [j1, j2, j3])
            assert before not in {raw.job_id for raw in raws}
            upto = next(i for i, raw in enumerate(raws) if raw.event == "completed" and raw.job_id == j2)
            await rd.producer.advance([AdvanceItem(raw.event_id, CLEAN) for raw in raws[: upto + 1]])
            assert _r(redis_url).get(cursor_key) == raws[upto].event_id.encode() == rd.producer.committed.encode()
        # a triggerer restart: what was read after j2 was never saved

        [j4] = await complete(redis_url, queue_name, 5)  # completes while no watcher runs
        async with reading(completion_producer(queue_name)) as rd:
            raws2 = await completed_of(rd, [j3, j4])
            unsaved = [raw.event_id for raw in raws[upto + 1:]]
            assert [raw.event_id for raw in raws2][: len(unsaved)] == unsaved  # resumes right after the cursor
            assert all(sid(raw.event_id) > sid(raws[upto].event_id) for raw in raws2)  # nothing saved comes back
            assert {raw.job_id for raw in raws2 if raw.event == "completed"} == {j3, j4}  # no replay, no skip
            await rd.producer.advance([AdvanceItem(raw.event_id, CLEAN) for raw in raws2])
            assert _r(redis_url).get(cursor_key) == raws2[-1].event_id.encode()


async def test_completion_held_event_keeps_the_cursor_and_is_reread(redis_url: str, queue_name: str) -> None:
    worker = make_worker(queue_name, redis_url)
    async with running(worker), reading(completion_producer(queue_name, reread_after_ms=200)) as rd:
        producer = rd.producer
        await rd.nothing_within(0.2)
        start = producer.committed
        ids = await complete(redis_url, queue_name, 6, 7, 8)
        raws = await completed_of(rd, ids)
        held = [raw for raw in raws if raw.event == "completed"][1]
        cut = raws.index(held)
        items = [AdvanceItem(raw.event_id, FAILED if raw is held else CLEAN) for raw in raws]
        await producer.advance(items[:cut + 1])  # the prefix up to the held event
        await producer.advance(items[cut + 1:])  # later events resolved too: still below the floor
        committed = producer.committed
        assert committed == raws[cut - 1].event_id and sid(committed) > sid(start)
        assert _r(redis_url).get(QueueKeys.for_queue(queue_name).cursor("airflow:square")) == committed.encode()
        again = [raw for raw, _ in await rd.take(len(raws) - cut)]  # re-read from the cursor
        assert [raw.event_id for raw in again] == [raw.event_id for raw in raws[cut:]]
        await producer.advance([AdvanceItem(raw.event_id, CLEAN) for raw in again])
        assert producer.committed == raws[-1].event_id


# ---- Airflow's SharedStreamManager drives the triggers (the triggerer's own code path) --------------
class Runner:
    """What ``TriggerRunner.run_trigger`` and ``sync_state_to_supervisor`` do for shared streams."""

    def __init__(self) -> None:
        self.manager = SharedStreamManager(ack_timeout=60)
        self.fired: list[tuple[int, dict, int | None]] = []
        self.tasks: dict[int, tuple[asyncio.Task, Any]] = {}
        self.confirmed: set[int] = set()

    def add(self, trigger_id: int, trigger: ChasquiQueueEventTrigger) -> None:
        key = trigger.shared_stream_key()
        stream = self.manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)

        async def consume() -> None:
            async for event in trigger.filter_shared_stream(stream):
                seq = self.manager.bind_pending_event(trigger_id=trigger_id, key=key)
                self.fired.append((trigger_id, event.payload, seq))

        self.tasks[trigger_id] = (asyncio.create_task(consume()), key)

    def persist(self) -> None:
        """The supervisor saved every event so far and confirms them on the next state sync."""
        seqs = [seq for _, _, seq in self.fired if seq is not None and seq not in self.confirmed]
        self.confirmed.update(seqs)
        self.manager.confirm_persisted(seqs)

    def fired_ids(self, trigger_id: int) -> list[str]:
        return [payload["job_id"] for tid, payload, _ in self.fired if tid == trigger_id]

    async def stop(self) -> None:
        for trigger_id, (task, key) in self.tasks.items():
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await self.manager.unsubscribe(trigger_id, key)
        await self.manager.stop_all()


async def test_queue_mode_acknowledges_after_airflow_saved_the_event(redis_url: str, queue_name: str) -> None:
    runner = Runner()
    try:
        runner.add(1, ChasquiQueueEventTrigger(queue_name=queue_name, job_names=["file_arrived"]))
        runner.add(2, ChasquiQueueEventTrigger(queue_name=queue_name, job_names=["file_arrived", "resize"]))
        file_id, resize_id, other_id = await add_jobs(redis_url, queue_name, ("file_arrived", {"p": 1}),
                                                      ("resize", {"w": 2}), ("thumbnail", {}))
        await wait_until(lambda: len(runner.fired) == 3, 15, what="three trigger events")
        assert runner.fired_ids(1) == [file_id] and runner.fired_ids(2) == [file_id, resize_id]
        assert all(seq is not None for _, _, seq in runner.fired)  # every event is persistence-gated
        # "thumbnail" was refused by both: dead-lettered at once, nothing to save
        await wait_until(lambda: _r(redis_url).xlen(QueueKeys.for_queue(queue_name).dlq) == 1, 10, what="the DLQ")
        await asyncio.sleep(0.5)
        assert pending(redis_url, queue_name) == 2  # fired but not saved: not acknowledged
        runner.persist()
        await wait_until(lambda: pending(redis_url, queue_name) == 0, 10, what="the acknowledgements")
        assert _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 0
        assert [e["id"] for e in events(redis_url, queue_name, "completed")] == [file_id, resize_id]
        [(_, dead)] = _r(redis_url).xrange(QueueKeys.for_queue(queue_name).dlq)
        assert dead[b"n"] == b"thumbnail" and dead[b"reason"] == b"unrecoverable"
        assert dead[b"detail"] == (b"job name 'thumbnail' is not watched (watching file_arrived); "
                                   b"job name 'thumbnail' is not watched (watching file_arrived, resize)")
        assert other_id not in runner.fired_ids(2)
    finally:
        await runner.stop()


async def test_completion_mode_moves_the_cursor_after_airflow_saved_the_event(redis_url: str,
                                                                              queue_name: str) -> None:
    cursor_key = QueueKeys.for_queue(queue_name).cursor("airflow:square")
    runner = Runner()
    worker = make_worker(queue_name, redis_url)
    async with running(worker):
        try:
            runner.add(7, ChasquiQueueEventTrigger(queue_name=queue_name, mode="completion", job_names=["square"]))
            await wait_until(lambda: _r(redis_url).exists(cursor_key), 10, what="the cursor")
            start = _r(redis_url).get(cursor_key)
            [greet] = await add_jobs(redis_url, queue_name, ("greet", {"who": "x"}))
            ids = await complete(redis_url, queue_name, 9, 10)
            await wait_until(lambda: len(runner.fired) == 2, 15, what="two trigger events")
            assert runner.fired_ids(7) == ids and greet not in runner.fired_ids(7)
            assert [p["event"] for _, p, _ in runner.fired] == ["completed", "completed"]
            await asyncio.sleep(0.5)
            saved = _r(redis_url).get(cursor_key)
            assert sid(saved) < sid(runner.fired[0][1]["event_id"])  # nothing saved yet: not moved past them
            runner.persist()
            last = runner.fired[-1][1]["event_id"]
            await wait_until(lambda: sid(_r(redis_url).get(cursor_key)) >= sid(last), 10, what="the cursor to move")
            assert sid(_r(redis_url).get(cursor_key)) > sid(start)
        finally:
            await runner.stop()


# ---- end to end: the real Airflow services ----------------------------------------------------------
QUEUE_DAG, COMPLETION_DAG = "chasqui_on_queue_jobs", "chasqui_on_square_completed"


def _query(db: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(sql, args).fetchall()


def _tail(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log")))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_end_to_end_with_the_real_scheduler_and_triggerer(airflow_home: dict[str, str], redis_url: str,
                                                          tmp_path: Path) -> None:
    """dag-processor + scheduler + triggerer + api-server (the DAGs' tasks call its execution
    API) on a private AIRFLOW_HOME with sqlite.  The example DAGs start paused; unpausing them
    registers their watchers; a ``file_arrived`` job and a completed ``square`` job each start
    a run, whose task reads ``triggering_asset_events``.  Then the triggerer is SIGKILLed, one
    job of each kind arrives while none runs, and a new triggerer resumes: one more run per
    DAG, carrying exactly the new jobs (no replay, no skip)."""
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    shutil.copy(Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db.migrated", home / "airflow.db")
    shutil.copy(Path(__file__).resolve().parents[2] / "example_dags" / "event_driven.py", home / "dags")
    db = home / "airflow.db"
    port = free_port()
    events_queue, work_queue = (f"t-ev-{tag}-{uuid.uuid4().hex[:6]}" for tag in ("jobs", "done"))
    env = {
        **airflow_home,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",  # LocalExecutor starts this many worker processes up front
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",  # a busy CI machine: tasks wait for the api-server
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        # one key for all: the dag-processor encrypts the watchers' trigger kwargs, the triggerer
        # decrypts them (processes that each generate an airflow.cfg would each pick their own)
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",  # a killed triggerer's watchers move on
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "CHASQUI_EVENTS_QUEUE": events_queue,
        "CHASQUI_EXAMPLES_QUEUE": work_queue,
    }
    procs: dict[str, subprocess.Popen] = {}
    marks: dict[str, float] = {}
    started = time.monotonic()

    def mark(name: str) -> None:
        marks[name] = round(time.monotonic() - started, 1)

    def wait_for(what: str, cond: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            dead = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
            assert not dead, f"Airflow services exited while waiting for {what}: {dead}\n{_tail(tmp_path)}"
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}\n{_tail(tmp_path)}"
            time.sleep(0.25)

    def airflow(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    def start(name: str, *args: str) -> None:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", *args], env=env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)

    def runs(dag_id: str) -> list[tuple]:
        return _query(db, "select run_id, run_type, state from dag_run where dag_id = ?", dag_id)

    def watcher_reads() -> bool:
        """The queue watcher made its consumer group (nothing else reads that queue)."""
        try:
            groups = r.xinfo_groups(QueueKeys.for_queue(events_queue).stream)
        except redis.ResponseError:  # no stream yet
            return False
        return any(g["name"] == b"default" for g in groups)

    def run_round(n: int, path: str, x: int, restart: bool = False) -> list[str]:
        """Enqueue one ``file_arrived`` job and complete one ``square`` job; wait for the n-th run
        of each DAG to succeed and check what its task read; then that the queue entry was
        acknowledged and the cursor moved past the completion."""
        with SyncQueue(events_queue, redis_url=redis_url) as q:
            file_job = q.add("file_arrived", {"path": path}).id
        with SyncQueue(work_queue, redis_url=redis_url) as q:
            square_job = q.add("square", {"x": x}).id
        enqueued = time.monotonic()
        if restart:
            wait_for("the square job", lambda: any(e["id"] == square_job for e in events(
                redis_url, work_queue, "completed")), 30)
            start("triggerer-2", "triggerer", "--skip-serve-logs")
        created: dict[str, float] = {}
        finished: dict[str, float] = {}

        def progress() -> bool:
            for dag_id in (QUEUE_DAG, COMPLETION_DAG):
                rows = runs(dag_id)
                if len(rows) >= n and dag_id not in created:
                    created[dag_id] = round(time.monotonic() - enqueued, 1)
                if sum(state in ("success", "failed") for _, _, state in rows) >= n and dag_id not in finished:
                    finished[dag_id] = round(time.monotonic() - enqueued, 1)
            return len(finished) == 2

        wait_for(f"run {n} of both DAGs to finish", progress, 150)
        print(f"round {n}: enqueue -> run created {created}, -> run finished {finished}")
        for dag_id in (QUEUE_DAG, COMPLETION_DAG):
            assert [(t, st) for _, t, st in runs(dag_id)] == [("asset_triggered", "success")] * n, _tail(tmp_path)
        xcom = {dag_id: json.loads(value) for dag_id, value in _query(  # the latest run's return values
            db, "select x.dag_id, x.value from xcom x where x.key = 'return_value' and x.run_id = "
                "(select run_id from dag_run where dag_id = x.dag_id order by id desc limit 1)")}
        assert xcom[QUEUE_DAG] == [{"job_id": file_job, "path": path}]
        assert xcom[COMPLETION_DAG] == {square_job: {"x": x, "square": x * x}}
        # saved, then acknowledged / cursor moved: nothing left to redeliver or replay
        wait_for("the queue-mode acknowledgement", lambda: pending(redis_url, events_queue) == 0 and
                 r.xlen(QueueKeys.for_queue(events_queue).stream) == 0, 30)
        done_event = next(e["_id"] for e in events(redis_url, work_queue, "completed") if e["id"] == square_job)
        wait_for("the completion cursor", lambda: sid(r.get(cursor_key)) >= sid(done_event), 30)
        return [file_job, square_job]

    worker = None
    r = _r(redis_url)
    cursor_key = QueueKeys.for_queue(work_queue).cursor("airflow:square")
    try:
        start("dag-processor", "dag-processor")
        start("triggerer", "triggerer", "--skip-serve-logs")
        start("scheduler", "scheduler", "--skip-serve-logs")
        start("api-server", "api-server", "--port", str(port))
        worker = WorkerProcess(redis_url, work_queue, tmp_path / "worker.txt")
        wait_for("both DAGs to be parsed", lambda: len(_query(
            db, "select dag_id from dag where dag_id in (?, ?) and is_paused = 1", QUEUE_DAG, COMPLETION_DAG)) == 2,
            120)
        mark("parsed")
        assert not _query(db, "select * from asset_watcher")  # paused DAGs: no watchers yet
        airflow("dags", "unpause", "--treat-dag-id-as-regex", "-y", "^chasqui_on_")
        mark("unpaused")
        wait_for("the watchers", lambda: len(_query(db, "select * from asset_watcher")) == 2, 60)
        mark("watchers registered")
        wait_for("the triggerer to run both watchers", lambda: r.exists(cursor_key) and watcher_reads(), 90)
        mark("watchers running")

        first = run_round(1, "/landing/a.csv", 12)
        mark("first runs finished")

        # a triggerer crash: SIGKILL; one job of each kind arrives while no triggerer runs; a new
        # triggerer takes the watchers over (after the dead one's heartbeat goes stale)
        os.killpg(procs["triggerer"].pid, signal.SIGKILL)
        procs.pop("triggerer").wait(10)
        mark("triggerer killed")
        second = run_round(2, "/landing/b.csv", 13, restart=True)
        mark("second runs finished")
        extras = [json.loads(e) for (e,) in _query(db, "select extra from asset_event order by id")]
        assert sorted(x["payload"]["job_id"] for x in extras) == sorted(first + second)  # no replay, no skip
        assert all(x["from_trigger"] for x in extras)
        mark("verified")
        print(f"event-driven e2e timings (s from the first service start): {marks}")
    finally:
        stop_services(procs)
        if worker is not None:
            worker.stop()
        for queue in (events_queue, work_queue):
            delete_queue_keys(redis_url, queue)
