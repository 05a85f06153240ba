"""The Chasqui operators against real Redis (and a real worker subprocess where jobs run)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from engine_support import raw_sync, wait_until_sync
from test_airflow_sensor import RecordingTI, _task_log

from airflow_provider_chasqui import BackoffSpec, ConfigError, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.operators.dlq import ChasquiReplayDLQOperator
from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger


def enqueue(**kwargs: object) -> ChasquiEnqueueOperator:
    kwargs.setdefault("task_id", "enqueue")
    kwargs.setdefault("job_name", "square")
    return ChasquiEnqueueOperator(**kwargs)  # type: ignore[arg-type]


@pytest.fixture
def queue(queue_name: str, redis_url: str):
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        yield q


def _stream_len(redis_url: str, queue_name: str) -> int:
    with raw_sync(redis_url) as r:
        return r.xlen(QueueKeys.for_queue(queue_name).stream)


def _delayed(redis_url: str, queue_name: str) -> int:
    with raw_sync(redis_url) as r:
        return r.zcard(QueueKeys.for_queue(queue_name).delayed)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": 1.0, "run_at": "2030-01-01T00:00:00"}, "delay or run_at"),
        ({"unique_key": "k"}, "need unique=True"),
        ({"wait_timeout": 5}, "needs wait_for_result"),
        ({"attempts": -1}, "attempts"),
        ({"backoff": {"kind": "linear", "delay_ms": 1}}, "backoff kind"),
        ({"delay": "soon"}, "delay must be"),
        ({"priority": 0}, "priority must be between"),
        ({"priority": "1"}, "priority must be an int"),
        ({"priority": 2, "job_id": "j"}, "priority cannot be combined"),
        ({"priority": 2, "delay": 5}, "priority cannot be combined"),
        ({"group": "t", "job_id": "j"}, "group cannot be combined"),
        ({"group": "t", "priority": 1}, "priority cannot be combined with group"),
        ({"dedup_id": "d"}, "dedup_ttl_ms must be a number of milliseconds"),
        ({"dedup_id": "d", "dedup_ttl_ms": 1000, "dedup_mode": "once"}, "unknown dedup_mode 'once'"),
        ({"dedup_id": "d", "dedup_ttl_ms": float("nan")}, "dedup_ttl_ms must be more than 0"),
        ({"dedup_id": "d", "dedup_ttl_ms": 1000, "job_id": "j"}, "dedup_id cannot be combined with job_id"),
        ({"dedup_id": "d", "dedup_ttl_ms": 1000, "unique": True}, "dedup_id cannot be combined with unique"),
        ({"dedup_ttl_ms": 1000}, "need dedup_id"),
        (
            {"wait_for_result": True, "wait_timeout": float("nan")},
            "wait_timeout must be a finite",
        ),  # was a NaN deadline
        ({"wait_for_result": True, "wait_timeout": float("inf")}, "wait_timeout must be a finite"),
        ({"delay": float("nan")}, "delay must be a finite"),
        ({"unique": True, "unique_window": float("inf")}, "unique_window must be a finite"),
        ({"wait_chunk_secs": 0}, "wait_chunk_secs must be a finite, positive"),
        ({"wait_chunk_secs": float("nan")}, "wait_chunk_secs must be a finite, positive"),
        ({"wait_chunk_secs": "10"}, "wait_chunk_secs must be a finite, positive"),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, ConfigError), match=message):
        enqueue(**kwargs)


def test_enqueue_returns_the_job_id_and_pushes_it(queue_name: str, redis_url: str) -> None:
    ti = RecordingTI()
    job_id = enqueue(data={"x": 2}, queue_name=queue_name, attempts=2, backoff=BackoffSpec.fixed(50)).execute(
        {"ti": ti}
    )
    assert ti.xcoms[("self", "job_id")] == job_id
    assert _stream_len(redis_url, queue_name) == 1


def test_priority_goes_to_the_prioritized_set_in_order(queue_name: str, redis_url: str) -> None:
    """Issue 24: the enqueue operator's ``priority``: the jobs wait beside the stream, most
    urgent first, and a worker runs them in that order."""
    ids = {
        p: enqueue(queue_name=queue_name, data={"p": p}, priority=p).execute({"ti": RecordingTI()}) for p in (3, 1, 2)
    }
    keys = QueueKeys.for_queue(queue_name)
    with raw_sync(redis_url) as r:
        assert r.zcard(keys.prioritized) == 3 and _stream_len(redis_url, queue_name) == 0
        members = r.zrange(keys.prioritized, 0, -1)
    assert [ids[p].encode() in m for p, m in zip((1, 2, 3), members)] == [True, True, True]


def test_group_goes_to_its_groups_list(queue_name: str, redis_url: str) -> None:
    """Issue 24: the enqueue operator's ``group`` (templated): the job waits in its group's list
    and the group joins the turn."""
    op = enqueue(queue_name=queue_name, data={"x": 1}, group="{{ params.tenant }}")
    op.group = "tenant-7"  # as rendered from the template
    job_id = op.execute({"ti": RecordingTI()})
    keys = QueueKeys.for_queue(queue_name)
    with raw_sync(redis_url) as r:
        assert r.zrange(keys.groups, 0, -1) == [b"tenant-7"] and _stream_len(redis_url, queue_name) == 0
        assert job_id.encode() in r.lindex(keys.group_jobs("tenant-7"), 0)


def test_dedup_throttles_and_debounces_runs_of_the_task(queue_name: str, redis_url: str) -> None:
    """Issue 25: the enqueue operator's ``dedup_id`` (templated): three runs of a throttled task
    within the window add one job (each run gets its id); two runs of a debounced task leave
    one job waiting with the last run's data."""
    ids = []
    for run in range(3):
        op = enqueue(queue_name=queue_name, data={"run": run}, dedup_id="{{ ds }}", dedup_ttl_ms=60_000)
        op.dedup_id = "report-2026-11-28"  # as rendered from the template
        ids.append(op.execute({"ti": RecordingTI()}))
    assert len(set(ids)) == 1 and _stream_len(redis_url, queue_name) == 1
    debounced = [
        enqueue(
            queue_name=queue_name, data={"run": run}, dedup_id="refresh", dedup_mode="debounce", dedup_ttl_ms=60_000
        ).execute({"ti": RecordingTI()})
        for run in range(2)
    ]
    assert _delayed(redis_url, queue_name) == 1
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert q.get_job_details(debounced[-1]).data == {"run": 1}


def test_delay_and_run_at_go_to_the_delayed_set(queue_name: str, redis_url: str) -> None:
    enqueue(queue_name=queue_name, data={"x": 1}, delay=timedelta(minutes=5)).execute({"ti": RecordingTI()})
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    enqueue(queue_name=queue_name, data={"x": 1}, run_at=later).execute({"ti": RecordingTI()})
    assert _delayed(redis_url, queue_name) == 2 and _stream_len(redis_url, queue_name) == 0


def test_job_id_and_unique_make_the_add_idempotent(queue_name: str, redis_url: str) -> None:
    first = enqueue(queue_name=queue_name, data={"x": 1}, job_id="run-1").execute({"ti": RecordingTI()})
    again = enqueue(queue_name=queue_name, data={"x": 1}, job_id="run-1").execute({"ti": RecordingTI()})
    assert first == again == "run-1"
    a = enqueue(queue_name=queue_name, data={"x": 5}, unique=True).execute({"ti": RecordingTI()})
    b = enqueue(queue_name=queue_name, data={"x": 5}, unique=True, unique_window=60).execute({"ti": RecordingTI()})
    c = enqueue(queue_name=queue_name, data={"x": 5}, unique=True, unique_key="other").execute({"ti": RecordingTI()})
    assert a == b != c
    assert _stream_len(redis_url, queue_name) == 3


def test_wait_for_result_defers_with_the_job(queue_name: str) -> None:
    op = enqueue(queue_name=queue_name, data={"x": 4}, wait_for_result=True, wait_timeout=60, deferrable=True)
    ti = RecordingTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    exc = deferred.value
    job_id = ti.xcoms[("self", "job_id")]
    assert isinstance(exc.trigger, ChasquiJobTrigger) and exc.trigger.job_ids == [job_id]
    assert exc.trigger.cancel_on_kill is True and exc.trigger.deadline is not None
    assert exc.method_name == "execute_complete" and exc.kwargs is None
    assert exc.timeout == timedelta(seconds=60)
    event = {"status": "success", "queue": queue_name, "results": {job_id: {"x": 4, "square": 16}}}
    assert op.resume_execution("execute_complete", {"event": event}, {}) == {"x": 4, "square": 16}
    failed = {"status": "error", "job_id": job_id, "reason": "unrecoverable", "detail": "", "queue": queue_name}
    with pytest.raises(AirflowFailException, match="unrecoverable"):
        op.resume_execution("execute_complete", {"event": failed}, {})


def test_blocking_wait_with_a_real_worker(queue_name: str, start_worker) -> None:
    start_worker(queue_name)
    ok = enqueue(queue_name=queue_name, data={"x": 12}, wait_for_result=True, deferrable=False)
    assert ok.execute({"ti": RecordingTI()}) == {"x": 12, "square": 144}
    bad = enqueue(job_name="explode", queue_name=queue_name, wait_for_result=True, deferrable=False)
    with pytest.raises(AirflowFailException, match="unrecoverable"):
        bad.execute({"ti": RecordingTI()})


def test_blocking_wait_times_out(queue_name: str) -> None:
    op = enqueue(queue_name=queue_name, wait_for_result=True, deferrable=False, wait_timeout=0.5, wait_chunk_secs=0.2)
    started = time.monotonic()
    with pytest.raises(AirflowException, match="still running"):
        op.execute({"ti": RecordingTI()})
    assert time.monotonic() - started < 5


def test_on_kill_cancels_a_delayed_job(queue_name: str, redis_url: str) -> None:
    op = enqueue(queue_name=queue_name, data={"x": 1}, delay=600.0, job_id="later")
    op.execute({"ti": RecordingTI()})
    assert _delayed(redis_url, queue_name) == 1
    op.on_kill()
    assert _delayed(redis_url, queue_name) == 0


def test_replay_dlq(queue: SyncQueue, queue_name: str, redis_url: str, start_worker) -> None:
    with raw_sync(redis_url) as r:  # undecodable entries at the head must not hide the others
        for junk in (b"\xc1", b"\xff" * 8):
            r.xadd(QueueKeys.for_queue(queue_name).dlq, {"d": junk, "reason": "decode_failed"})
    for n in range(3):
        queue.add("explode", {"n": n})
    worker = start_worker(queue_name)
    wait_until_sync(lambda: len(queue.peek_dlq(10)) == 5, timeout=30, what="three dead letters")
    worker.stop()
    assert ChasquiReplayDLQOperator(task_id="replay", queue_name=queue_name, limit=2).execute({}) == 2
    assert len(queue.peek_dlq(10)) == 3 and _stream_len(redis_url, queue_name) == 2
    with pytest.raises(ValueError, match="limit"):
        ChasquiReplayDLQOperator(task_id="replay", limit=0)


# ---- repeatable specs ---------------------------------------------------------------------
from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern  # noqa: E402
from airflow_provider_chasqui.operators.repeatable import (  # noqa: E402
    ChasquiPauseRepeatableOperator,
    ChasquiRemoveRepeatableOperator,
    ChasquiResumeRepeatableOperator,
    ChasquiUpsertRepeatableOperator,
)


def upsert(**kwargs: object) -> ChasquiUpsertRepeatableOperator:
    kwargs.setdefault("task_id", "upsert")
    kwargs.setdefault("job_name", "daily_report")
    return ChasquiUpsertRepeatableOperator(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of cron and every"),
        ({"cron": "0 6 * * *", "every": 60}, "exactly one of cron and every"),
        ({"every": 60, "tz": "UTC"}, "tz only applies to cron"),
        ({"every": 0.0001}, "at least one millisecond"),
        ({"cron": "* * * * *", "missed_fires": "fire-all"}, "needs max_catchup"),
        ({"cron": "* * * * *", "missed_fires": "skip", "max_catchup": 2}, "only applies to missed_fires='fire-all'"),
        ({"cron": "* * * * *", "missed_fires": "sometimes"}, "must be 'skip', 'fire-once' or 'fire-all'"),
        ({"cron": "* * * * *", "limit": 0}, "limit must be a positive int"),
        ({"cron": "* * * * *", "while_paused": "drop"}, "while_paused must be 'queue' or 'skip'"),
        ({"cron": "* * * * *", "timeout_ms": 0}, "timeout_ms must be more than 0"),
        ({"cron": "* * * * *", "timeout_ms": float("nan")}, "timeout_ms must be more than 0"),
        ({"cron": "* * * * *", "priority": 0}, "priority must be between"),
        ({"cron": "* * * * *", "priority": "1"}, "priority must be an int"),
        ({"cron": "* * * * *", "priority": 1, "group": "g"}, "priority cannot be combined with group"),
        ({"cron": "* * * * *", "dedup_id": "d", "dedup_ttl_ms": 0}, "dedup_ttl_ms must be more than 0"),
        ({"cron": "* * * * *", "dedup_id": "d", "dedup_mode": "x", "dedup_ttl_ms": 5}, "unknown dedup_mode"),
        ({"cron": "* * * * *", "dedup_ttl_ms": 5}, "need dedup_id"),
        ({"cron": "* * * * *", "dedup_id": "d", "dedup_ttl_ms": 5, "group": "g"}, "cannot be combined with priority"),
    ],
)
def test_upsert_arguments_fail_at_parse_time(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        upsert(**kwargs)


def test_upsert_cron_spec_and_update_it_in_place(queue: SyncQueue, queue_name: str) -> None:
    start = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    with _task_log() as logged:
        key = upsert(
            queue_name=queue_name,
            data={"report": "sales"},
            cron="0 6 * * *",
            tz="America/Lima",
            key="daily-sales",
            start_after=start.isoformat(),
            missed_fires="fire-all",
            max_catchup=3,
            deadline=timedelta(minutes=30),
            while_paused="skip",
            attempts=4,
            backoff={"kind": "fixed", "delay_ms": 1000},
            limit=10,
            timeout_ms=90_000,
        ).execute({})
    assert key == "daily-sales"
    assert queue.get_repeatable_job(key).timeout_ms == 90_000  # every fire's own timeout
    info = queue.get_repeatable_job(key)
    fire = datetime.fromtimestamp(info.next_fire_ms / 1000, UTC).isoformat(timespec="seconds")
    line = f'repeatable spec daily-sales upserted: cron "0 6 * * *" in America/Lima; next fire {fire}'
    assert any(line in m for m in logged), logged  # readable, not a raw RepeatPattern(...)
    assert info.pattern == RepeatPattern.cron("0 6 * * *", tz="America/Lima")
    assert info.data == {"report": "sales"} and info.attempts == 4 and info.limit == 10
    assert info.missed_fires == MissedFiresPolicy.fire_all(3) and info.deadline_ms == 30 * 60 * 1000
    assert info.while_paused == "skip"
    assert info.start_after_ms == int(start.timestamp() * 1000) and info.next_fire_ms > info.start_after_ms
    again = upsert(
        queue_name=queue_name, data={"report": "costs"}, cron="0 7 * * *", tz="America/Lima", key="daily-sales"
    ).execute({})
    assert again == key
    assert queue.get_repeatable_job(key).data == {"report": "costs"}
    assert [m.key for m in queue.get_repeatable_jobs()] == [key]


def test_upsert_a_spec_whose_fires_take_a_priority_a_group_or_a_dedup_id(queue: SyncQueue, queue_name: str) -> None:
    """Every fire of the spec waits beside the stream (tests/scheduler/test_sched_side_lanes.py
    proves the fires); the operator stores the option, and a bad rendered group fails the task."""
    urgent = upsert(queue_name=queue_name, every=60, key="urgent", priority=2).execute({})
    tenant = upsert(queue_name=queue_name, every=60, key="tenant", group="tenant-7").execute({})
    assert (queue.get_repeatable_job(urgent).priority, queue.get_repeatable_job(urgent).group) == (2, None)
    assert (queue.get_repeatable_job(tenant).priority, queue.get_repeatable_job(tenant).group) == (None, "tenant-7")
    assert "group" in ChasquiUpsertRepeatableOperator.template_fields
    with pytest.raises(ConfigError, match="group must be 1 to 128 bytes"):
        upsert(queue_name=queue_name, every=60, key="long", group="g" * 129).execute({})
    assert queue.get_repeatable_job("long") is None
    deduped = upsert(queue_name=queue_name, every=60, key="feed", dedup_id="feed-1", dedup_ttl_ms=30_000).execute({})
    info = queue.get_repeatable_job(deduped)
    assert (info.dedup_id, info.dedup_mode, info.dedup_ttl_ms) == ("feed-1", "throttle", 30_000)
    assert "dedup_id" in ChasquiUpsertRepeatableOperator.template_fields


def test_upsert_every_derives_the_key(queue: SyncQueue, queue_name: str) -> None:
    key = upsert(queue_name=queue_name, data=None, every=timedelta(minutes=5)).execute({})
    assert queue.get_repeatable_job(key).pattern == RepeatPattern.every(300_000)


def test_pause_resume_remove(queue: SyncQueue, queue_name: str) -> None:
    key = upsert(queue_name=queue_name, cron="*/5 * * * *", key="k").execute({})

    def run(cls: type, **kwargs: object) -> bool:
        return cls(task_id="t", key=key, queue_name=queue_name, **kwargs).execute({})

    assert run(ChasquiPauseRepeatableOperator) is True and queue.get_repeatable_job(key).paused
    assert run(ChasquiPauseRepeatableOperator) is True  # idempotent
    assert run(ChasquiResumeRepeatableOperator) is True and not queue.get_repeatable_job(key).paused
    assert run(ChasquiRemoveRepeatableOperator) is True and queue.get_repeatable_job(key) is None
    assert run(ChasquiRemoveRepeatableOperator) is False
    for cls in (ChasquiRemoveRepeatableOperator, ChasquiPauseRepeatableOperator, ChasquiResumeRepeatableOperator):
        with pytest.raises(AirflowFailException, match="no repeatable spec with key 'k'"):
            run(cls, missing_ok=False)
