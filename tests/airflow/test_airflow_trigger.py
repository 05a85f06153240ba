"""ChasquiJobTrigger: serialization round trips and real runs against Redis.

The runs use an in-process engine ``Worker`` (same event loop) with the example handlers,
so every event comes from real Redis traffic; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import time
from typing import Any

import pytest
import redis
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import TriggerEvent
from engine_support import running, wait_until
from servers import free_port
from test_airflow_sensor import _task_log

from airflow_provider_chasqui import Queue, Worker
from airflow_provider_chasqui.core.event_hub import reader_name
from airflow_provider_chasqui.examples.handlers import HANDLERS
from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger, json_safe_problem

CASES = [
    {"job_ids": ["01J0000000000000000000000A"], "queue_name": "q"},
    {
        "job_ids": ["a", "b", "c"],
        "queue_name": "fan-out",
        "chasqui_conn_id": "other",
        "deadline": 1_900_000_000.5,
        "wait_chunk_secs": 2.5,
        "cancel_on_kill": True,
    },
    {"job_ids": [f"job-{i}" for i in range(100)], "queue_name": "ünïcode queue", "deadline": None},
]


def make_worker(queue: str, handlers: object, url: str, **kwargs: object) -> Worker:
    return Worker(queue, handlers, redis_url=url, run_scheduler=False, read_block_ms=1000, **kwargs)


def _import(classpath: str) -> type:
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("kwargs", CASES)
def test_serialize_round_trip(kwargs: dict) -> None:
    trigger = ChasquiJobTrigger(**kwargs)
    classpath, data = trigger.serialize()
    assert _import(classpath) is ChasquiJobTrigger
    assert set(data) == set(inspect.signature(ChasquiJobTrigger).parameters)  # exactly the __init__ args
    assert json.loads(json.dumps(data)) == data  # JSON-safe as is
    revived = _import(classpath)(**deserialize(serialize(data)))  # what the triggerer does
    assert revived.serialize() == (classpath, data)
    for key, value in kwargs.items():
        assert data[key] == value


@pytest.mark.parametrize("bad", [[], "one-id", [""], [1], None])
def test_rejects_bad_job_ids(bad: object) -> None:
    with pytest.raises(ValueError, match="job_ids"):
        ChasquiJobTrigger(job_ids=bad, queue_name="q")  # type: ignore[arg-type]


def test_duplicate_ids_are_waited_for_once() -> None:
    assert ChasquiJobTrigger(job_ids=["a", "b", "a"], queue_name="q").job_ids == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, None, True, "x"]}, None),
        (b"raw", "result is a bytes"),
        ({"k": [1, b"x"]}, "result['k'][1] is a bytes"),
        ({1: "x"}, "result has a non-string key 1"),
        # JSON has no NaN: the REST API showed it as null; a PostgreSQL JSON column refuses it
        ({"m": [1.0, float("nan")]}, "result['m'][1] is a non-finite float (nan): JSON has no such number"),
        (float("-inf"), "result is a non-finite float (-inf): JSON has no such number"),
    ],
)
def test_json_safe_problem(value: object, problem: str | None) -> None:
    assert json_safe_problem(value) == problem


async def _first_event(trigger: ChasquiJobTrigger, timeout: float = 30.0) -> dict:
    event = await asyncio.wait_for(anext(trigger.run()), timeout)
    assert isinstance(event, TriggerEvent)
    assert deserialize(serialize(event.payload)) == event.payload  # Airflow can carry it
    return event.payload


async def test_success_returns_handler_results(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        jobs = [await q.add("square", {"x": x}) for x in (3, 4)]
        trigger = ChasquiJobTrigger(job_ids=[j.id for j in jobs], queue_name=queue_name)
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True)):
            payload = await _first_event(trigger)
    assert payload == {
        "status": "success",
        "queue": queue_name,
        "results": {jobs[0].id: {"x": 3, "square": 9}, jobs[1].id: {"x": 4, "square": 16}},
    }
    assert trigger._queue is None  # closed in finally


async def test_already_finished_job_fires_without_waiting(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        job = await q.add("greet", {"who": "x"})
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True)):
            assert await q.wait_for_result(job.id, timeout=15) == "hello, x"
    started = time.monotonic()
    payload = await _first_event(ChasquiJobTrigger(job_ids=[job.id], queue_name=queue_name, wait_chunk_secs=30))
    assert payload["results"] == {job.id: "hello, x"}
    assert time.monotonic() - started < 5


async def test_dead_lettered_job_is_an_error_event(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        ok = await q.add("square", {"x": 2})
        bad = await q.add("explode", {"n": 1})
        trigger = ChasquiJobTrigger(job_ids=[ok.id, bad.id], queue_name=queue_name)
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True)):
            payload = await _first_event(trigger)
    tb = payload.pop("traceback")
    assert payload == {
        "status": "error",
        "job_id": bad.id,
        "reason": "unrecoverable",
        "queue": queue_name,
        "detail": "handler: Python handler raised: UnrecoverableError(\"explode refuses {'n': 1}\")",
    }
    # the handler's traceback, innermost frame last, as the worker recorded it
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith("UnrecoverableError: explode refuses {'n': 1}") and "in explode" in tb


async def test_result_airflow_cannot_carry_is_an_error_event(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        job = await q.add("raw", None)
        trigger = ChasquiJobTrigger(job_ids=[job.id], queue_name=queue_name)
        async with running(make_worker(queue_name, {"raw": lambda job: b"\x00\x01"}, redis_url, store_results=True)):
            payload = await _first_event(trigger)
    assert payload["status"] == "error" and payload["reason"] == "result_not_json_safe"
    assert "result is a bytes" in payload["detail"]


async def test_deadline_fires_a_timeout_event(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        job = await q.add("square", {"x": 1})  # no worker: it never finishes
    started = time.monotonic()
    trigger = ChasquiJobTrigger(
        job_ids=[job.id], queue_name=queue_name, deadline=time.time() + 1.5, wait_chunk_secs=0.5
    )
    payload = await _first_event(trigger)
    assert payload == {"status": "timeout", "pending": [job.id], "queue": queue_name}
    assert 1.4 <= time.monotonic() - started < 5


async def test_blocks_on_redis_and_cancels_promptly(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        job = await q.add("square", {"x": 1})
    trigger = ChasquiJobTrigger(job_ids=[job.id], queue_name=queue_name, wait_chunk_secs=60)
    task = asyncio.create_task(anext(trigger.run()))
    with redis.Redis.from_url(redis_url) as r:

        def blocked_reads() -> list[dict]:
            # only this queue's events reader (named by the hub): other tests may block on XREAD too
            mine = reader_name(queue_name)
            return [
                c
                for c in r.client_list()
                if c.get("name") == mine and c.get("cmd") == "xread" and "b" in c.get("flags", "")
            ]

        await wait_until(blocked_reads, what="the trigger's blocking XREAD on the events stream")
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 2
        assert trigger._queue is None  # the pool was closed on the way out
        await wait_until(lambda: not blocked_reads(), what="the blocked connection to go away")


async def test_fan_out_of_100_jobs(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        jobs = await q.add_bulk([{"name": "square", "data": {"x": i}} for i in range(100)])
        trigger = ChasquiJobTrigger(job_ids=[j.id for j in jobs], queue_name=queue_name)
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True, concurrency=20)):
            payload = await _first_event(trigger)
    assert payload["status"] == "success"
    assert [payload["results"][j.id]["square"] for j in jobs] == [i * i for i in range(100)]


async def test_on_kill_cancels_delayed_jobs_only_when_asked(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        keep = await q.add("square", {"x": 1}, delay=60.0, job_id="keep-me")
        drop = await q.add("square", {"x": 2}, delay=60.0, job_id="drop-me")
        await ChasquiJobTrigger(job_ids=[keep.id], queue_name=queue_name).on_kill()
        await ChasquiJobTrigger(job_ids=[drop.id], queue_name=queue_name, cancel_on_kill=True).on_kill()
        assert await q.get_job_state(keep.id) == "delayed"
        assert await q.get_job_state(drop.id) == "cancelled"


async def test_unreachable_redis_is_retried_until_the_deadline(queue_name: str, monkeypatch) -> None:
    port = free_port()  # a port nobody listens on
    monkeypatch.setenv("AIRFLOW_CONN_DEAD", json.dumps({"conn_type": "chasqui", "host": "127.0.0.1", "port": port}))
    trigger = ChasquiJobTrigger(job_ids=["x"], queue_name=queue_name, chasqui_conn_id="dead", deadline=time.time() + 2)
    payload = await _first_event(trigger)
    assert payload["status"] == "timeout"


async def test_results_keep_job_id_order_across_chunks(queue_name: str, redis_url: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        late = await q.add("square", {"x": 1}, delay=1.0)
        early = await q.add("square", {"x": 2})
        trigger = ChasquiJobTrigger(job_ids=[late.id, early.id], queue_name=queue_name, wait_chunk_secs=0.3)
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True, promoter_poll_ms=50)):
            payload = await _first_event(trigger)
    assert list(payload["results"]) == [late.id, early.id]


async def test_waiting_triggers_share_one_events_reader(queue_name: str, redis_url: str) -> None:
    """200 deferred tasks of one triggerer cost one reader connection, not 200 (the hub)."""

    async with Queue(queue_name, redis_url=redis_url) as q:
        jobs = await q.add_bulk([{"name": "square", "data": {"x": i}} for i in range(200)])
    triggers = [ChasquiJobTrigger(job_ids=[j.id], queue_name=queue_name) for j in jobs]
    tasks = [asyncio.create_task(_first_event(t, 120)) for t in triggers]
    with redis.Redis.from_url(redis_url) as r:

        def readers() -> list[dict]:
            return [c for c in r.client_list() if c.get("name") == reader_name(queue_name)]

        await wait_until(lambda: len(readers()) == 1, what="the hub's reader")
        async with running(make_worker(queue_name, HANDLERS, redis_url, store_results=True, concurrency=20)):
            payloads = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert len(readers()) <= 1
        await wait_until(lambda: not readers(), what="the reader to close after the last trigger")
    for job, payload in zip(jobs, payloads):
        assert payload == {
            "status": "success",
            "queue": queue_name,
            "results": {job.id: {**job.data, "square": job.data["x"] ** 2}},
        }


async def test_a_wait_nobody_consumes_warns_at_once_and_says_where_its_job_is(queue_name: str, redis_url: str) -> None:
    """Issue 28: a wait on a queue no worker consumes warns at its start, then logs the job's
    state every ``state_log_secs`` (here a delayed job) until its deadline."""
    async with Queue(queue_name, redis_url=redis_url) as q:
        job = await q.add("square", {"x": 1}, delay=60.0)
    trigger = ChasquiJobTrigger(
        job_ids=[job.id], queue_name=queue_name, deadline=time.time() + 3.5, wait_chunk_secs=0.5, state_log_secs=1
    )
    with _task_log() as logged:
        payload = await _first_event(trigger)
    assert payload["status"] == "timeout"
    assert any(f"queue {queue_name} has no live worker: no worker has read it yet" in m for m in logged), logged
    lines = [m for m in logged if "still waiting for job" in m]
    assert 2 <= len(lines) <= 4 and all(f"{job.id} on queue {queue_name}: delayed until 20" in m for m in lines), lines


async def test_a_wait_on_a_running_job_logs_its_worker_attempt_and_progress(queue_name: str, redis_url: str) -> None:
    async def slow(job):
        await job.update_progress(40)
        await asyncio.sleep(3)
        return "done"

    worker = make_worker(queue_name, {"slow": slow}, redis_url, store_results=True)
    async with running(worker):
        async with Queue(queue_name, redis_url=redis_url) as q:
            job = await q.add("slow", {})
            await wait_until(lambda: _progress_is(q, job.id, 40), 30, what="the job's progress")
        trigger = ChasquiJobTrigger(job_ids=[job.id], queue_name=queue_name, wait_chunk_secs=0.5, state_log_secs=0.5)
        with _task_log() as logged:
            payload = await _first_event(trigger)
    assert payload["status"] == "success"
    assert not [m for m in logged if "has no live worker" in m], logged
    lines = [m for m in logged if "still waiting for job" in m]
    assert any(f"active on worker {worker.consumer_id}, attempt 1, progress 40" in m for m in lines), lines


async def _progress_is(q: Queue, job_id: str, value: object) -> bool:
    return (await q.get_job_details(job_id)).progress == value


def test_state_log_secs_is_checked() -> None:
    for bad in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="state_log_secs"):
            ChasquiJobTrigger(job_ids=["a"], queue_name="q", state_log_secs=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"deadline": float("nan")}, "deadline must be None or a finite"),  # compared false: never timed out
        ({"deadline": float("inf")}, "deadline must be None or a finite"),
        ({"deadline": "soon"}, "deadline must be None or a finite"),  # a TypeError in the triggerer
        ({"job_ids": ["\udcff"]}, "job_id must be text that encodes as UTF-8"),
        ({"job_ids": ["a" * 10_000]}, "job_id must be a non-empty str of at most"),
        ({"job_ids": [5]}, "job_ids must be a non-empty list of job id strings"),
        ({"queue_name": "q{x"}, "hash tag"),
        ({"queue_name": "\udcff"}, "queue name must be text that encodes as UTF-8"),
        ({"chasqui_conn_id": 5}, "chasqui_conn_id must be a connection id"),
        ({"chasqui_conn_id": "\udcff"}, "chasqui_conn_id must be text that encodes as UTF-8"),
        ({"cancel_on_kill": "yes"}, "cancel_on_kill must be True or False"),
        ({"traceparent": 5}, "traceparent must be None or a W3C traceparent str"),
    ],
)
def test_bad_arguments_are_refused_where_the_trigger_is_made(kwargs: dict[str, Any], match: str) -> None:
    """Each was taken and failed later in the triggerer (an encoding crash, a TypeError) or,
    a NaN deadline, waited forever."""
    with pytest.raises(ValueError, match=match):
        ChasquiJobTrigger(**{"job_ids": ["a"], "queue_name": "q", **kwargs})


def test_wait_chunk_secs_is_checked() -> None:
    """NaN passed the old ``<= 0`` check and reached the wait; a str raised ``TypeError``."""
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="wait_chunk_secs"):
            ChasquiJobTrigger(job_ids=["a"], queue_name="q", wait_chunk_secs=bad)  # type: ignore[arg-type]
