"""ChasquiJobSensor: the check before deferring, the deferral itself, resuming, and the
poke/reschedule path, against real Redis with a real worker subprocess where jobs must run.

``context`` is a plain dict: only the upstream-XCom case needs a ``ti``, given by a small
recorder (the real task instance is exercised by the ``dag.test()`` end-to-end tests).
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import pytest
import structlog.testing
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferred,
)
from airflow_support import conn_json

from airflow_provider_chasqui import JobFailed, SyncQueue
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor
from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger


class RecordingTI:
    """Just enough of a task instance for ``xcom_pull``/``xcom_push``."""

    def __init__(self, xcoms: dict[tuple[str, str], object] | None = None) -> None:
        self.xcoms = dict(xcoms or {})

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> object:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: object) -> None:
        self.xcoms[("self", key)] = value


def sensor(**kwargs: object) -> ChasquiJobSensor:
    kwargs.setdefault("task_id", "wait")
    kwargs.setdefault("deferrable", True)  # the default follows the config: test_airflow_deferrable.py
    return ChasquiJobSensor(**kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def _task_log():
    """The events the operator logs meanwhile (``self.log`` is a structlog logger in Airflow 3)."""
    with structlog.testing.capture_logs() as entries:
        lines: list[str] = []
        yield lines
    lines.extend(
        str(e.get("event", "")) % tuple(e.get("positional_args", ()))
        if e.get("positional_args")
        else str(e.get("event", ""))
        for e in entries
    )


@pytest.fixture
def queue(queue_name: str, redis_url: str):
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        yield q


@pytest.mark.parametrize("kwargs", [{}, {"job_id": "a", "upstream_task_id": "up"}])
def test_needs_exactly_one_source_of_ids(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        sensor(**kwargs)


@pytest.mark.parametrize("bad", [0, float("nan"), float("inf"), "5"])
def test_wait_chunk_secs_is_checked_when_the_dag_is_parsed(bad: object) -> None:
    with pytest.raises(ValueError, match="wait_chunk_secs"):
        sensor(job_id="a", wait_chunk_secs=bad)


def test_defers_when_the_job_is_not_done(queue: SyncQueue, queue_name: str) -> None:
    job = queue.add("square", {"x": 3})
    op = sensor(job_id=job.id, queue_name=queue_name, timeout=120, wait_chunk_secs=5)
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})
    exc = deferred.value
    assert exc.method_name == "execute_complete"
    assert exc.kwargs is None  # dag.test() would drop them: the resume re-derives the ids
    assert exc.timeout == timedelta(seconds=120)
    assert isinstance(exc.trigger, ChasquiJobTrigger)
    _, kwargs = exc.trigger.serialize()
    assert kwargs["job_ids"] == [job.id] and kwargs["queue_name"] == queue_name
    assert kwargs["chasqui_conn_id"] == "chasqui_default" and kwargs["wait_chunk_secs"] == 5
    assert before + 120 <= kwargs["deadline"] <= time.time() + 120
    assert kwargs["cancel_on_kill"] is False  # the sensor does not own the jobs


def test_queue_name_defaults_to_the_connection(queue: SyncQueue, queue_name: str, redis_url: str, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WITH_QUEUE", conn_json(redis_url, default_queue=queue_name))
    job = queue.add("square", {"x": 3})
    with pytest.raises(TaskDeferred) as deferred:
        sensor(job_id=job.id, chasqui_conn_id="with_queue").execute({})
    assert deferred.value.trigger.queue_name == queue_name


def test_checks_once_before_deferring(queue: SyncQueue, queue_name: str, start_worker) -> None:
    jobs = [queue.add("square", {"x": x}) for x in (5, 6)]
    start_worker(queue_name)
    for job in jobs:
        queue.wait_for_result(job.id, timeout=30)
    op = sensor(job_id=[j.id for j in jobs], queue_name=queue_name)
    with _task_log() as lines:
        assert op.execute({}) == {jobs[0].id: {"x": 5, "square": 25}, jobs[1].id: {"x": 6, "square": 36}}
    # a fast wait says what it found too: queue, the ids, the state, the results
    assert any(
        queue_name in line and jobs[0].id in line and "completed" in line and "'square': 36" in line for line in lines
    ), lines


def test_dead_lettered_job_fails_the_check(queue: SyncQueue, queue_name: str, start_worker) -> None:
    job = queue.add("explode", {"n": 1})
    start_worker(queue_name)
    with pytest.raises(JobFailed):
        queue.wait_for_result(job.id, timeout=30)
    with (
        _task_log() as lines,
        pytest.raises(AirflowFailException, match=f"job {job.id} on queue {queue_name} failed: unrecoverable") as info,
    ):
        sensor(job_id=job.id, queue_name=queue_name).execute({})
    # the message and the task log carry the handler's traceback, innermost frame last
    for text in (str(info.value), "\n".join(lines)):
        assert "handler traceback (from the Chasqui worker):\nTraceback (most recent call last):" in text, text
        assert "in explode" in text and "UnrecoverableError: explode refuses {'n': 1}" in text
    with pytest.raises(AirflowSkipException):
        sensor(job_id=job.id, queue_name=queue_name, soft_fail=True).execute({})


def test_ids_from_upstream_xcom(queue: SyncQueue, queue_name: str) -> None:
    job = queue.add("square", {"x": 1})
    ti = RecordingTI({("enqueue", "job_id"): job.id})
    with pytest.raises(TaskDeferred) as deferred:
        sensor(upstream_task_id="enqueue", xcom_key="job_id", queue_name=queue_name).execute({"ti": ti})
    assert deferred.value.trigger.job_ids == [job.id]
    with pytest.raises(AirflowFailException, match="no Chasqui job id"):
        sensor(upstream_task_id="missing", queue_name=queue_name).execute({"ti": ti})


SUCCESS = {"status": "success", "queue": "q", "results": {"a": 1, "b": {"k": [2]}}}


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("a", 1),
        (["b", "a"], {"b": {"k": [2]}, "a": 1}),
    ],
)
def test_execute_complete_returns_results(job_id: object, expected: object) -> None:
    assert sensor(job_id=job_id).execute_complete({}, SUCCESS) == expected


def test_deferred_resume_shows_the_handler_traceback(queue: SyncQueue, queue_name: str, start_worker) -> None:
    """The deferrable path end to end: a real trigger's error event, resumed by the sensor."""
    import asyncio

    job = queue.add("explode", {"n": 3})
    start_worker(queue_name)
    with pytest.raises(JobFailed):
        queue.wait_for_result(job.id, timeout=30)
    trigger = ChasquiJobTrigger(job_ids=[job.id], queue_name=queue_name)

    async def first() -> dict:
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("no event")

    event = asyncio.run(first())
    assert event["status"] == "error" and "UnrecoverableError: explode refuses {'n': 3}" in event["traceback"]
    with _task_log() as lines, pytest.raises(AirflowFailException) as info:
        sensor(job_id=job.id, queue_name=queue_name).resume_execution("execute_complete", {"event": event}, {})
    for text in (str(info.value), "\n".join(lines)):
        assert f"job {job.id} on queue {queue_name} failed: unrecoverable" in text
        assert "handler traceback (from the Chasqui worker):" in text and "in explode" in text, text


def test_resume_maps_errors_like_airflow_sensors() -> None:
    """Through ``resume_execution``, the path the task runner takes after a trigger fired."""
    error = {"status": "error", "job_id": "a", "reason": "retries_exhausted", "detail": "", "queue": "q"}
    timeout = {"status": "timeout", "pending": ["a"], "queue": "q"}
    kwargs: dict = {}
    with pytest.raises(AirflowFailException, match="job a on queue q failed: retries_exhausted"):
        sensor(job_id="a").resume_execution("execute_complete", {**kwargs, "event": error}, {})
    with pytest.raises(AirflowSensorTimeout, match="still running"):
        sensor(job_id="a").resume_execution("execute_complete", {**kwargs, "event": timeout}, {})
    for event in (error, timeout):
        with pytest.raises(AirflowSkipException):
            sensor(job_id="a", soft_fail=True).resume_execution("execute_complete", {**kwargs, "event": event}, {})
    assert sensor(job_id="a").resume_execution("execute_complete", {**kwargs, "event": SUCCESS}, {}) == 1


def test_poke_mode_waits_for_a_real_worker(queue: SyncQueue, queue_name: str, start_worker) -> None:
    job = queue.add("square", {"x": 9}, delay=1.0)  # still delayed at the first pokes
    start_worker(queue_name)
    op = sensor(job_id=job.id, queue_name=queue_name, deferrable=False, poke_interval=0.1, timeout=30)
    assert op.execute({}) == {"x": 9, "square": 81}


def test_poke_mode_timeout_and_soft_fail(queue: SyncQueue, queue_name: str) -> None:
    job = queue.add("square", {"x": 1})  # no worker
    with pytest.raises(AirflowSensorTimeout):
        sensor(job_id=job.id, queue_name=queue_name, deferrable=False, poke_interval=0.1, timeout=0.5).execute({})
    with pytest.raises(AirflowSkipException):
        sensor(
            job_id=job.id, queue_name=queue_name, deferrable=False, poke_interval=0.1, timeout=0.5, soft_fail=True
        ).execute({})


def test_poke_mode_fails_on_the_dlq(queue: SyncQueue, queue_name: str, start_worker) -> None:
    job = queue.add("explode", {"n": 2})
    start_worker(queue_name)
    op = sensor(job_id=job.id, queue_name=queue_name, deferrable=False, poke_interval=0.1, timeout=30)
    with pytest.raises(AirflowFailException, match="unrecoverable"):
        op.execute({})


def test_on_kill_without_a_check_in_progress_is_a_no_op() -> None:
    sensor(job_id="a").on_kill()
