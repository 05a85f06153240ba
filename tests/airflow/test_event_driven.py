"""Event-driven scheduling: ``MessageQueueTrigger(scheme="chasqui")`` asset watchers.

* the trigger's serialization and the common-messaging provider discovery;
* both producers against the shared Redis: queue mode acknowledges only in ``advance`` and
  re-reads what a crashed watcher left pending (the crash is a SIGKILLed process), completion
  mode keeps its cursor in Redis and resumes without replay or skip;
* the ack gate through Airflow's real ``SharedStreamManager``, driven the way the triggerer
  drives it (subscribe, ``filter_shared_stream``, ``bind_pending_event``, ``confirm_persisted``);
* end to end with the real scheduler, dag-processor, triggerer and api-server: in
  ``test_event_bursts.py`` (both modes, bursts, a triggerer SIGKILLed and restarted).

Completion events come from a real in-process ``Worker``; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome, SharedStreamManager
from airflow_support import conn_json
from engine_support import running, wait_until

from airflow_provider_chasqui import ConfigError, Queue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.examples.handlers import HANDLERS
from airflow_provider_chasqui.queues.chasqui import ChasquiMessageQueueProvider
from airflow_provider_chasqui.triggers.queue_events import (
    WATCHER_CONSUMER,
    ChasquiQueueEventTrigger,
    CompletedJob,
    CompletionBatch,
    CompletionModeProducer,
    QueueBatch,
    QueueJob,
    QueueModeProducer,
    default_cursor,
)

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
    {"queue_name": "files", "max_batch": 1000, "linger_ms": 0, "event_gap_ms": 5000},
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


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"queue_name": "a{b}"}, "hash tag"),
        ({"queue_name": ""}, "empty"),
        ({"queue_name": "q", "mode": "completed"}, "mode must be one of"),
        ({"queue_name": "q", "cursor": "c"}, "only applies to mode='completion'"),
        ({"queue_name": "q", "mode": "completion", "cursor": "a}b"}, "cursor must be"),
        ({"queue_name": "q", "job_names": []}, "job_names"),
        ({"queue_name": "q", "job_names": "square"}, "job_names"),
        ({"queue_name": "q", "job_names": ["", "x"]}, "job_names"),
        ({"queue_name": "q", "chasqui_conn_id": ""}, "chasqui_conn_id"),
        ({"queue_name": "q", "max_batch": 0}, "max_batch must be an integer from 1 to 1000"),
        ({"queue_name": "q", "max_batch": 1001}, "max_batch"),
        ({"queue_name": "q", "max_batch": True}, "max_batch"),
        ({"queue_name": "q", "linger_ms": -1}, "linger_ms must be an integer from 0 to 5000"),
        ({"queue_name": "q", "linger_ms": "50"}, "linger_ms"),
        ({"queue_name": "q", "event_gap_ms": 600_001}, "event_gap_ms must be an integer from 0 to 600000"),
    ],
)
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
    """One event per read batch with the jobs this watcher takes, oldest first; each job notes
    who took or refused it."""
    trigger = ChasquiQueueEventTrigger(queue_name="q", job_names=["file_arrived"])
    job = QueueJob("q", b"1-0", "J1", "file_arrived", {"path": "/in/a.csv"}, 1, 123, b"raw")
    other = QueueJob("q", b"1-1", "J2", "resize", {}, 1, 123, b"raw")
    binary = QueueJob("q", b"1-2", "J3", "file_arrived", {"blob": b"\x00"}, 1, 123, b"raw")
    later = QueueJob("q", b"2-0", "J4", "file_arrived", None, 2, 456, b"raw")
    event = trigger.decide(QueueBatch("q", [job, other, binary, later]))
    assert isinstance(event, TriggerEvent)
    assert event.payload == {
        "mode": "queue",
        "queue": "q",
        "count": 2,
        "jobs": [
            {
                "job_id": "J1",
                "name": "file_arrived",
                "data": {"path": "/in/a.csv"},
                "attempt": 1,
                "created_at_ms": 123,
                "entry_id": "1-0",
            },
            {
                "job_id": "J4",
                "name": "file_arrived",
                "data": None,
                "attempt": 2,
                "created_at_ms": 456,
                "entry_id": "2-0",
            },
        ],
    }
    assert deserialize(serialize(event.payload)) == event.payload
    assert (job.accepted, later.accepted, other.accepted, binary.accepted) == (1, 1, 0, 0)
    assert other.reject_reasons == ["job name 'resize' is not watched (watching file_arrived)"]
    assert binary.reject_reasons == ["data['blob'] is a bytes: an asset event carries JSON-compatible data only"]
    nan = QueueJob("q", b"2-1", "J6", "file_arrived", {"score": float("nan")}, 1, 1, b"raw")
    assert trigger.decide(QueueBatch("q", [nan])) == "every job of the batch refused (1)"
    assert nan.reject_reasons == [
        "data['score'] is a non-finite float (nan): JSON has no such number: an asset event carries JSON-compatible"
        " data only"
    ]
    assert (
        trigger.decide(QueueBatch("q", [QueueJob("q", b"3-0", "J5", "x", 1, 1, 1, b"")]))
        == "every job of the batch refused (1)"
    )

    completion = ChasquiQueueEventTrigger(queue_name="q", mode="completion", job_names=["square"])
    done = CompletedJob("q", "5-0", "completed", "J4", "square", 77, {"attempt": "1", "duration_us": "12"})
    greet = CompletedJob("q", "5-2", "completed", "J5", "greet", 78, {})
    event = completion.decide(CompletionBatch("q", [done, greet], "5-3"))
    assert isinstance(event, TriggerEvent) and event.payload == {
        "mode": "completion",
        "queue": "q",
        "count": 1,
        "jobs": [
            {
                "event": "completed",
                "job_id": "J4",
                "name": "square",
                "ts_ms": 77,
                "event_id": "5-0",
                "attempt": 1,
                "duration_us": 12,
            }
        ],
    }
    assert completion.decide(CompletionBatch("q", [greet], "5-2")) is None


# ---- common-messaging discovery -------------------------------------------------------------------
def test_message_queue_trigger_resolves_to_the_chasqui_trigger() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk import Asset, AssetWatcher

    assert "airflow_provider_chasqui.queues.chasqui.ChasquiMessageQueueProvider" in ProvidersManager().queue_class_names
    mqt = MessageQueueTrigger(
        scheme="chasqui", queue_name="files", mode="completion", job_names=["square"], cursor="nightly"
    )
    assert isinstance(mqt.trigger, ChasquiQueueEventTrigger)
    assert mqt.serialize() == (
        CLASSPATH,
        {
            "queue_name": "files",
            "mode": "completion",
            "job_names": ["square"],
            "chasqui_conn_id": "chasqui_default",
            "cursor": "nightly",
            "max_batch": 100,
            "linger_ms": 100,
            "event_gap_ms": 0,
        },
    )
    asset = Asset("chasqui_files", watchers=[AssetWatcher(name="w", trigger=mqt)])
    assert asset.watchers[0].trigger is mqt
    provider = ChasquiMessageQueueProvider()
    assert provider.scheme_matches("chasqui") and not provider.scheme_matches("redis+pubsub")
    assert provider.trigger_class() is ChasquiQueueEventTrigger


def test_uri_form() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    with pytest.warns(DeprecationWarning, match="queue"):
        mqt = MessageQueueTrigger(queue="chasqui://etl_redis/in%2Ffiles?job_names=a,b&job_names=c")
    assert mqt.serialize()[1] == {
        "queue_name": "in/files",
        "mode": "queue",
        "job_names": ["a", "b", "c"],
        "chasqui_conn_id": "etl_redis",
        "cursor": None,
        "max_batch": 100,
        "linger_ms": 100,
        "event_gap_ms": 0,
    }
    provider = ChasquiMessageQueueProvider()
    assert provider.queue_matches("chasqui:///q") and not provider.queue_matches("redis+pubsub://x")
    assert provider.trigger_kwargs("chasqui:///reports?mode=completion&cursor=nightly") == {
        "queue_name": "reports",
        "mode": "completion",
        "cursor": "nightly",
    }
    assert provider.trigger_kwargs("chasqui:///q?max_batch=500&linger_ms=0&event_gap_ms=2000") == {
        "queue_name": "q",
        "max_batch": 500,
        "linger_ms": 0,
        "event_gap_ms": 2000,
    }
    for bad, match in [
        ("chasqui:///q?max_batch=x", "whole number"),
        ("chasqui:///q?linger_ms=1&linger_ms=2", "once"),
        ("chasqui://conn/", "names no queue"),
        ("chasqui:///q?colour=red", "unknown chasqui URI"),
        ("chasqui:///q?mode=queue&mode=completion", "given 2 times"),
        ("kafka:///q", "not a chasqui"),
        ("chasqui:///q?max_batch=\u00b2", "whole number"),  # '²'.isdigit(): int() raised its own error
        ("chasqui:///%ff", "percent-escapes that are not UTF-8"),  # was the queue '\ufffd'
        ("chasqui://%ff/q", "percent-escapes that are not UTF-8"),
        ("chasqui:///q?job_names=a,%ff", "percent-escapes that are not UTF-8"),
    ]:
        with pytest.raises(ValueError, match=match):
            provider.trigger_kwargs(bad)
    with pytest.raises(ValueError, match="both in the URI"):
        provider.trigger_kwargs("chasqui:///q?mode=completion", mode="queue")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"job_names": [1, "a"]}, "job_names must hold non-empty strings"),  # was a TypeError from sorting
        ({"job_names": [["a"]]}, "job_names must hold non-empty strings"),
        ({"job_names": ["\udcff"]}, "job_names must be text that encodes as UTF-8"),
        ({"mode": "completion", "cursor": "\udcff"}, "cursor must be text that encodes as UTF-8"),
        ({"chasqui_conn_id": "\udcff"}, "chasqui_conn_id must be text that encodes as UTF-8"),
        ({"chasqui_conn_id": ""}, "chasqui_conn_id must be a connection id"),
    ],
)
def test_bad_trigger_arguments_are_value_errors_naming_them(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChasquiQueueEventTrigger(**{"queue_name": "q", **kwargs})


# ---- queue mode against Redis ---------------------------------------------------------------------
def queue_producer(queue: str, **kwargs: Any) -> QueueModeProducer:
    return QueueModeProducer(queue_name=queue, chasqui_conn_id="chasqui_default", **kwargs)


async def add_jobs(url: str, queue: str, *jobs: tuple[str, Any], **kwargs: Any) -> list[str]:
    async with Queue(queue, redis_url=url) as q:
        return [(await q.add(name, data, **kwargs)).id for name, data in jobs]


def taken(batch: QueueBatch, outcome: AdvanceOutcome = CLEAN) -> AdvanceItem:
    """The batch as a watcher that took every job of it resolves it."""
    for job in batch.jobs:
        job.accepted += 1
    return AdvanceItem(batch, outcome)


async def batch_of(rd: Reader, timeout: float = 15.0) -> QueueBatch:
    [(raw, payload)] = await rd.take(1, timeout)
    assert raw is payload and isinstance(raw, QueueBatch) and raw.jobs
    return raw


async def jobs_until(rd: Reader, n: int) -> list[QueueJob]:
    """Batches (each taken and advanced: the next is read only then) until ``n`` jobs came."""
    jobs: list[QueueJob] = []
    while len(jobs) < n:
        batch = await batch_of(rd)
        jobs += batch.jobs
        await rd.producer.advance([taken(batch)])
    return jobs


async def test_queue_entries_are_acknowledged_only_in_advance(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(3)])
    async with reading(queue_producer(queue_name)) as rd:
        producer = rd.producer
        batch = await batch_of(rd)  # all three in one batch, oldest first
        assert [job.job_id for job in batch.jobs] == ids
        assert [job["data"] for job in batch.payload()["jobs"]] == [{"n": 0}, {"n": 1}, {"n": 2}]
        info = _r(redis_url).xpending(producer.keys.stream, "default")
        assert info["pending"] == 3 and info["consumers"] == [{"name": WATCHER_CONSUMER.encode(), "pending": 3}]
        more = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 3}))
        await rd.nothing_within(0.3)  # not advanced: neither acknowledged nor a next batch read
        assert _r(redis_url).xlen(producer.keys.stream) == 4 and pending(redis_url, queue_name) == 3
        await producer.advance([taken(batch)])
        assert _r(redis_url).xlen(producer.keys.stream) == 1 and pending(redis_url, queue_name) == 0
        assert [e["id"] for e in events(redis_url, queue_name, "completed")] == ids
        assert producer.acked_total == 3
        nxt = await batch_of(rd)
        assert [job.job_id for job in nxt.jobs] == more


async def test_a_burst_is_one_batch_up_to_max_batch(redis_url: str, queue_name: str) -> None:
    """Jobs sent one by one while the reader waits: the first wakes it, the rest arrive within
    ``linger_ms`` and join its batch; ``max_batch`` cuts a longer burst."""
    async with reading(queue_producer(queue_name, max_batch=7, linger_ms=300)) as rd:
        await rd.nothing_within(0.3)  # the reader blocks on the empty queue
        ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(10)])
        first = await batch_of(rd)
        await rd.producer.advance([taken(first)])
        second = await batch_of(rd)
        await rd.producer.advance([taken(second)])
        assert [j.job_id for j in first.jobs] == ids[:7] and [j.job_id for j in second.jobs] == ids[7:]
        assert rd.producer.batches_total == 2 and pending(redis_url, queue_name) == 0


async def test_event_gap_spaces_the_batches(redis_url: str, queue_name: str) -> None:
    """With ``event_gap_ms`` the next batch is read that long after the previous one was advanced
    (only a lower bound is checked: a loaded machine is slower, never faster)."""
    ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(3)])
    async with reading(queue_producer(queue_name, max_batch=2, event_gap_ms=600)) as rd:
        first = await batch_of(rd)
        await rd.producer.advance([taken(first)])
        advanced = time.monotonic()
        second = await batch_of(rd)
        assert time.monotonic() - advanced >= 0.55
        await rd.producer.advance([taken(second)])
        assert [j.job_id for j in first.jobs + second.jobs] == ids


CRASHING_WATCHER = textwrap.dedent("""
    import asyncio, sys
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome
    from airflow_provider_chasqui.triggers.queue_events import QueueModeProducer

    async def main(queue):
        producer = QueueModeProducer(queue_name=queue, chasqui_conn_id="chasqui_default")
        stream = producer.open_stream()
        batch, _ = await anext(stream)
        print("READ", " ".join(job.job_id for job in batch.jobs), flush=True)
        await asyncio.sleep(600)  # SIGKILLed here: three entries read, never acknowledged

    asyncio.run(main(sys.argv[1]))
""")


async def test_a_crashed_watcher_loses_nothing(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """SIGKILL a watcher process after it read a batch of 3 jobs: the next watcher re-reads
    them (as new deliveries), oldest first, in one batch with a job that arrived meanwhile."""
    ids = await add_jobs(redis_url, queue_name, *[("file_arrived", {"n": i}) for i in range(3)])
    script = tmp_path / "watcher.py"
    script.write_text(CRASHING_WATCHER)
    log = tmp_path / "watcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), queue_name], stdout=out, stderr=subprocess.STDOUT)
    try:
        await wait_until(
            lambda: "READ" in log.read_text() or proc.poll() is not None, 60, what="the watcher", interval=0.05
        )
        assert f"READ {' '.join(ids)}" in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert pending(redis_url, queue_name) == 3 and _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 3
    later = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 3}))

    async with reading(queue_producer(queue_name)) as rd:
        batch = await batch_of(rd)
        assert [(job.job_id, job.attempt) for job in batch.jobs] == [(i, 2) for i in ids] + [(later[0], 1)]
        await rd.producer.advance([taken(batch)])
        await rd.nothing_within(0.5)
        assert pending(redis_url, queue_name) == 0 and _r(redis_url).xlen(rd.producer.keys.stream) == 0
        assert sorted(e["id"] for e in events(redis_url, queue_name, "completed")) == sorted(ids + later)


async def test_refused_jobs_go_to_the_dlq_with_a_reason(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, ("resize", {"w": 1}), ("file_arrived", {"p": "x"}))
    async with reading(queue_producer(queue_name)) as rd:
        producer = rd.producer
        batch = await batch_of(rd)
        refused, mixed = batch.jobs
        refused.reject_reasons += ["job name 'resize' is not watched (watching file_arrived)"] * 2
        mixed.reject_reasons.append("not mine")
        mixed.accepted = 1
        await producer.advance([AdvanceItem(batch, AdvanceOutcome(acked=1, failed=0, rejected=1))])
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
    """A failed batch comes back whole; of a clean one, a job nobody looked at is held."""
    ids = await add_jobs(redis_url, queue_name, ("a", 1), ("b", 2), ("c", 3))
    async with reading(queue_producer(queue_name, redeliver_after_ms=200)) as rd:
        batch = await batch_of(rd)
        started = time.monotonic()
        await rd.producer.advance([taken(batch, FAILED)])
        again = await batch_of(rd)
        assert time.monotonic() - started >= 0.15
        assert [(job.job_id, job.attempt) for job in again.jobs] == [(i, 2) for i in ids]
        assert pending(redis_url, queue_name) == 3
        again.jobs[0].accepted = again.jobs[1].accepted = 1  # c: its watcher left before looking at it
        await rd.producer.advance([AdvanceItem(again, CLEAN)])
        assert pending(redis_url, queue_name) == 1
        third = await batch_of(rd)
        assert [(job.job_id, job.attempt) for job in third.jobs] == [(ids[2], 3)]
        await rd.producer.advance([taken(third, NOBODY)])  # no subscriber online: held again
        fourth = await batch_of(rd)
        await rd.producer.advance([taken(fourth)])
        await rd.nothing_within(0.5)
        assert pending(redis_url, queue_name) == 0 and _r(redis_url).xlen(rd.producer.keys.stream) == 0


async def test_attempts_bound_the_redeliveries(redis_url: str, queue_name: str) -> None:
    """A job whose watchers keep failing is delivered ``attempts`` times, then dead-lettered."""
    [job_id] = await add_jobs(redis_url, queue_name, ("file_arrived", {}), attempts=2)
    async with reading(queue_producer(queue_name, redeliver_after_ms=100)) as rd:
        for attempt in (1, 2):
            batch = await batch_of(rd)
            assert [(job.job_id, job.attempt) for job in batch.jobs] == [(job_id, attempt)]
            await rd.producer.advance([taken(batch, FAILED)])
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
        got = await jobs_until(rd, 2)
        assert sorted((job.job_id, job.attempt) for job in got) == sorted([(orphan, 2), (delayed, 1)])
        [(_, fields)] = r.xrange(keys.dlq)
        assert fields[b"reason"] == b"malformed" and fields[b"detail"] == b"missing or non-bytes payload field"
        assert pending(redis_url, queue_name) == 0 and r.xlen(keys.stream) == 0 and r.zcard(keys.delayed) == 0


async def test_standalone_run_acknowledges_when_the_next_event_is_asked_for(redis_url: str, queue_name: str) -> None:
    ids = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 1}), ("resize", {}), ("file_arrived", {"n": 2}))
    trigger = ChasquiQueueEventTrigger(queue_name=queue_name, job_names=["file_arrived"])
    run = trigger.run()
    try:
        first = await asyncio.wait_for(anext(run), 15)
        assert [job["job_id"] for job in first.payload["jobs"]] == [ids[0], ids[2]]
        assert pending(redis_url, queue_name) == 3
        [later] = await add_jobs(redis_url, queue_name, ("file_arrived", {"n": 3}))
        second = await asyncio.wait_for(anext(run), 15)  # acknowledges the first batch, refuses "resize"
        assert [job["job_id"] for job in second.payload["jobs"]] == [later]
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
        batch = await batch_of(rd)
        batch.jobs[0].accepted = 1
        batch.jobs[1].reject_reasons.append("no")  # and nobody looked at the third: held
        await first.advance([AdvanceItem(batch, AdvanceOutcome(acked=1, failed=0, rejected=1))])
        assert (await first._queue.driver.features()).xackdel == (
            matrix_url.kind == "redis82" and not matrix_url.force_compat
        )
    r = _r(matrix_url.url)
    assert r.xlen(keys.stream) == 1 and r.xlen(keys.dlq) == 1 and pending(matrix_url.url, queue_name) == 1
    second = QueueModeProducer(queue_name=queue_name, chasqui_conn_id="chasqui_matrix")
    async with reading(second) as rd:
        batch = await batch_of(rd)
        assert [(job.job_id, job.attempt) for job in batch.jobs] == [(ids[2], 2)]
        await second.advance([taken(batch)])
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
    await wait_until(
        lambda: {e["id"] for e in events(url, queue, "completed")} >= set(ids),
        15,
        what="the jobs to complete",
        interval=0.02,
    )
    return ids


async def completion_batch(rd: Reader) -> CompletionBatch:
    [(raw, through)] = await rd.take(1)
    assert isinstance(raw, CompletionBatch) and raw.through == through and raw.completions
    assert all(c.event == "completed" for c in raw.completions)
    return raw


async def test_completion_cursor_resumes_without_replay_or_skip(redis_url: str, queue_name: str) -> None:
    worker = make_worker(queue_name, redis_url)
    cursor_key = QueueKeys.for_queue(queue_name).cursor("airflow:square")
    async with running(worker):
        [before] = await complete(redis_url, queue_name, 1)
        last_before = events(redis_url, queue_name)[-1]["_id"]

        async with reading(completion_producer(queue_name)) as rd:
            await rd.nothing_within(0.3)  # the cursor starts at the end: no replay of older events
            assert _r(redis_url).get(cursor_key) == last_before.encode()
            [j1] = await complete(redis_url, queue_name, 2)
            first = await completion_batch(rd)
            assert [c.job_id for c in first.completions] == [j1]
            await rd.producer.advance([AdvanceItem(first.through, CLEAN)])
            assert _r(redis_url).get(cursor_key) == first.through.encode() == rd.producer.committed.encode()
            [j2] = await complete(redis_url, queue_name, 3)
            unsaved = await completion_batch(rd)
            assert [c.job_id for c in unsaved.completions] == [j2]
        # a triggerer restart: the batch of j2 was never saved

        [j3] = await complete(redis_url, queue_name, 4)  # completes while no watcher runs
        async with reading(completion_producer(queue_name)) as rd:
            again = await completion_batch(rd)  # resumes right after the cursor: j2 and j3 in one batch
            assert [c.job_id for c in again.completions] == [j2, j3]
            assert all(sid(c.event_id) > sid(first.through) for c in again.completions)  # no replay, no skip
            await rd.producer.advance([AdvanceItem(again.through, CLEAN)])
            assert _r(redis_url).get(cursor_key) == again.through.encode()
            assert before not in {c.job_id for c in first.completions + again.completions}


@pytest.mark.timeout(60)
async def test_completion_watcher_reads_on_once_a_full_events_stream_is_made_again(
    redis_url: str, queue_name: str
) -> None:
    """An entry at the largest id (any writer may add it) is read and committed: the events
    stream is full, and once it is deleted every new id is below the saved cursor.  The watcher
    read nothing ever again; now it reads on from before that entry, in the same run."""
    from airflow_provider_chasqui.core.event_follow import LAST_STREAM_ID

    r, keys = _r(redis_url), QueueKeys.for_queue(queue_name)
    worker = make_worker(queue_name, redis_url)
    async with running(worker), reading(completion_producer(queue_name, block_ms=200)) as rd:
        await rd.nothing_within(0.3)
        r.xadd(keys.events, {"e": "completed", "id": "junk", "n": "square", "ts": "1"}, id=LAST_STREAM_ID)
        junk = await completion_batch(rd)
        assert [c.job_id for c in junk.completions] == ["junk"] and junk.through == LAST_STREAM_ID
        await rd.producer.advance([AdvanceItem(junk.through, CLEAN)])
        assert r.get(keys.cursor("airflow:square")) == LAST_STREAM_ID.encode()
        r.delete(keys.events)  # the way out of a full stream
        [j1] = await complete(redis_url, queue_name, 5)
        batch = await completion_batch(rd)
        assert [c.job_id for c in batch.completions] == [j1]
        await rd.producer.advance([AdvanceItem(batch.through, CLEAN)])
        assert r.get(keys.cursor("airflow:square")) == batch.through.encode()


@pytest.mark.timeout(60)
async def test_completion_reports_trimmed_events_and_refuses_a_bad_cursor(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Events trimmed after the saved cursor are reported (XINFO STREAM, real Redis) and what
    is left is read; a cursor that is not a stream id stops the watcher with ConfigError."""
    r, keys = _r(redis_url), QueueKeys.for_queue(queue_name)
    ids = [r.xadd(keys.events, {"e": "completed", "id": f"j{i}", "n": "square", "ts": "1"}).decode() for i in range(5)]
    r.set(keys.cursor("airflow:square"), ids[0])
    r.xtrim(keys.events, maxlen=2, approximate=False)  # ids[1] and ids[2] go unread
    caplog.set_level("WARNING", logger="airflow_provider_chasqui.triggers.queue_events")
    async with reading(completion_producer(queue_name)) as rd:
        batch = await completion_batch(rd)
        assert [c.job_id for c in batch.completions] == ["j3", "j4"] and batch.through == ids[4]
    trimmed = [m for m in caplog.messages if "were trimmed" in m]
    assert len(trimmed) == 1 and f"cursor {ids[0]}, ids ({ids[0]}, {ids[3]})," in trimmed[0]

    caplog.clear()
    r.set(keys.cursor("airflow:square"), ids[4])  # nothing after it was trimmed: no report
    async with reading(completion_producer(queue_name)) as rd:
        await rd.nothing_within(0.3)
        assert rd.producer.committed == ids[4]
    assert not [m for m in caplog.messages if "were trimmed" in m]

    r.set(keys.cursor("airflow:square"), "latest")
    producer = completion_producer(queue_name)
    stream = producer.open_stream()
    try:
        with pytest.raises(ConfigError, match="not a stream id"):
            await anext(stream)
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_completion_held_batch_keeps_the_cursor_and_is_reread(redis_url: str, queue_name: str) -> None:
    worker = make_worker(queue_name, redis_url)
    async with running(worker), reading(completion_producer(queue_name, reread_after_ms=200)) as rd:
        producer = rd.producer
        await rd.nothing_within(0.2)
        await wait_until(lambda: producer.committed != "", 10, what="the cursor to load")
        start = producer.committed
        ids = await complete(redis_url, queue_name, 6, 7, 8)
        seen: list[str] = []
        while len(seen) < len(ids):  # the worker may complete them over more than one batch
            batch = await completion_batch(rd)
            await producer.advance([AdvanceItem(batch.through, FAILED)])  # not saved: the cursor stays
            assert producer.committed == start
            again = await completion_batch(rd)  # re-read from the cursor
            assert [c.event_id for c in again.completions] == [c.event_id for c in batch.completions]
            await producer.advance([AdvanceItem(again.through, CLEAN)])
            assert producer.committed == again.through
            assert _r(redis_url).get(QueueKeys.for_queue(queue_name).cursor("airflow:square")) == again.through.encode()
            start = again.through
            seen += [c.job_id for c in again.completions]
        assert seen == ids


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
        return [job["job_id"] for tid, payload, _ in self.fired if tid == trigger_id for job in payload["jobs"]]

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
        await wait_until(
            lambda: _r(redis_url).exists(QueueKeys.for_queue(queue_name).stream),
            15,
            what="the watcher's consumer group",
        )
        async with Queue(queue_name, redis_url=redis_url) as q:  # one pipeline: one batch
            jobs = await q.add_bulk(
                [
                    {"name": "file_arrived", "data": {"p": 1}},
                    {"name": "resize", "data": {"w": 2}},
                    {"name": "thumbnail", "data": {}},
                ]
            )
        file_id, resize_id, other_id = (job.id for job in jobs)
        await wait_until(lambda: len(runner.fired) == 2, 15, what="one trigger event per watcher")
        assert runner.fired_ids(1) == [file_id] and runner.fired_ids(2) == [file_id, resize_id]
        assert all(seq is not None for _, _, seq in runner.fired)  # every event is persistence-gated
        await asyncio.sleep(0.5)
        assert pending(redis_url, queue_name) == 3  # fired but not saved: nothing acknowledged nor dead-lettered
        assert _r(redis_url).xlen(QueueKeys.for_queue(queue_name).dlq) == 0
        runner.persist()
        await wait_until(lambda: pending(redis_url, queue_name) == 0, 10, what="the acknowledgements")
        assert _r(redis_url).xlen(QueueKeys.for_queue(queue_name).stream) == 0
        assert [e["id"] for e in events(redis_url, queue_name, "completed")] == [file_id, resize_id]
        # "thumbnail" was refused by both: dead-lettered with the batch's acknowledgement
        [(_, dead)] = _r(redis_url).xrange(QueueKeys.for_queue(queue_name).dlq)
        assert dead[b"n"] == b"thumbnail" and dead[b"reason"] == b"unrecoverable"
        assert dead[b"detail"] == (
            b"job name 'thumbnail' is not watched (watching file_arrived); "
            b"job name 'thumbnail' is not watched (watching file_arrived, resize)"
        )
        assert other_id not in runner.fired_ids(2)
    finally:
        await runner.stop()


async def test_completion_mode_moves_the_cursor_after_airflow_saved_the_event(redis_url: str, queue_name: str) -> None:
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
            await wait_until(lambda: runner.fired, 15, what="a trigger event")
            await asyncio.sleep(0.5)
            first = runner.fired[0][1]["jobs"][0]["event_id"]
            assert sid(_r(redis_url).get(cursor_key)) < sid(first)  # nothing saved yet: not moved past it
            while len(runner.fired_ids(7)) < len(ids):  # the two may come in one batch or two
                runner.persist()
                await asyncio.sleep(0.1)
            assert runner.fired_ids(7) == ids and greet not in runner.fired_ids(7)
            assert all(job["event"] == "completed" for _, p, _ in runner.fired for job in p["jobs"])
            runner.persist()
            last = runner.fired[-1][1]["jobs"][-1]["event_id"]
            await wait_until(lambda: sid(_r(redis_url).get(cursor_key)) >= sid(last), 10, what="the cursor to move")
            assert sid(_r(redis_url).get(cursor_key)) > sid(start)
        finally:
            await runner.stop()


def test_chasqui_asset_says_which_queue_feeds_it() -> None:
    """Issue 28: ``chasqui_asset`` names its watcher after the feed (Airflow's asset page lists
    watchers by name) and describes it in ``extra["chasqui"]``; bad arguments fail at parse time."""
    from airflow_provider_chasqui.queues.assets import chasqui_asset
    from airflow_provider_chasqui.triggers.queue_events import ChasquiQueueEventTrigger

    a = chasqui_asset("files", queue_name="in coming&go", job_names=["f"], max_batch=7, extra={"owner": "data"})
    (w,) = a.watchers
    assert w.name == "chasqui queue in coming&go on chasqui_default (f)"
    assert isinstance(w.trigger.trigger, ChasquiQueueEventTrigger)
    assert w.trigger.trigger.serialize()[1]["max_batch"] == 7
    assert a.extra == {
        "owner": "data",
        "chasqui": {
            "queue": "in coming&go",
            "mode": "queue",
            "connection": "chasqui_default",
            "job_names": ["f"],
            "dashboard": "/plugin/chasqui/chasqui/queue?src=chasqui_default&queue=in+coming%26go",
        },
    }
    done = chasqui_asset("done", queue_name="q", mode="completion", chasqui_conn_id="other")
    assert done.watchers[0].name == "chasqui completions of q on other"
    for kw, match in (
        ({"queue_name": ""}, "queue name"),
        ({"queue_name": "a{b}"}, "hash tag"),
        ({"queue_name": "q", "mode": "all"}, "mode must be"),
        ({"queue_name": "q", "chasqui_conn_id": ""}, "chasqui_conn_id"),
        ({"queue_name": "q", "job_names": ["", "x"]}, "job_names"),
    ):
        with pytest.raises(ConfigError, match=match):
            chasqui_asset("bad", **kw)
