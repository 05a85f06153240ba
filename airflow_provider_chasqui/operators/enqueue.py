"""``ChasquiEnqueueOperator``: add one job to a Chasqui queue, optionally waiting for its result."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from .. import tracing
from ..core.dedup import check_dedup
from ..core.priorities import check_priority
from ..core.running import check_timeout_ms
from ..hooks.chasqui import ChasquiHook
from ..sync.queue import SyncQueue
from ..triggers.job import ChasquiJobTrigger, first_error
from ..types import BackoffSpec, Job, build_retry_override
from ._common import (
    as_datetime,
    as_seconds,
    chunk_seconds,
    default_deferrable,
    log_outcome,
    log_resumed,
    record_origin,
    result_from_event,
    waited_seconds,
)
from .links import ChasquiJobLink

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ChasquiEnqueueOperator"]


def _check_lanes(
    placed: dict[str, Any],
    priority: int | None,
    group: str | None,
    dedup_id: str | None,
    dedup_mode: str,
    dedup_ttl_ms: int | float | None,
) -> None:
    """``priority``, ``group`` and ``dedup_id`` exclude each other and the options that place a
    job in time or by id (``placed``: those given are not None); checked when the DAG is parsed."""
    for what, value in (("priority", priority), ("group", group)):
        if value is None:
            continue
        if what == "priority":
            check_priority(value)
        if any(v is not None for v in placed.values()):
            raise ValueError(f"{what} cannot be combined with delay, run_at, job_id or unique")
    if priority is not None and group is not None:
        raise ValueError("priority cannot be combined with group")
    if dedup_id is not None:
        check_dedup("checked-at-run-time", dedup_mode, dedup_ttl_ms)  # the id may be a template
        clash = {**placed, "priority": priority, "group": group}
        taken = [k for k, v in clash.items() if v is not None]
        if taken:
            raise ValueError(f"dedup_id cannot be combined with {', '.join(taken)}")
    elif dedup_ttl_ms is not None or dedup_mode != "throttle":
        raise ValueError("dedup_mode and dedup_ttl_ms need dedup_id")


class ChasquiEnqueueOperator(BaseOperator):
    """Enqueues a job for Chasqui workers; pushes its id to XCom (key ``job_id``).

    Without ``wait_for_result`` the task ends as soon as the job is in Redis and returns the
    job id.  With ``wait_for_result=True`` it waits for the job and returns the handler's
    result (the worker needs ``store_results=True``): deferred to the triggerer with
    ``deferrable=True`` (the default follows ``[operators] default_deferrable``), or blocking in
    the worker slot otherwise.  A dead-lettered job fails the
    task with the DLQ reason.  An Airflow retry enqueues again unless ``job_id`` (or
    ``unique``) makes the add idempotent.  Not thread-safe (one instance per task).

    :param job_name: the job name workers dispatch on. (templated)
    :param data: the job's payload, anything msgpack encodes. (templated)
    :param queue_name: the queue; default: the connection's ``default_queue``. (templated)
    :param chasqui_conn_id: the ``chasqui`` connection. (templated)
    :param delay: run after this long (``timedelta`` or float seconds); excludes ``run_at``.
    :param run_at: run at this time (datetime or ISO 8601 string; naive = UTC). (templated)
    :param job_id: a caller-chosen id; a second add of the same id is a no-op. (templated)
    :param unique: add only if no job with the same unique key was added within ``unique_window``.
    :param unique_key: the unique key; default: ``job_id``, else a hash of name and data. (templated)
    :param unique_window: how long the unique key holds (``timedelta`` or seconds; default 1 h).
    :param attempts: attempts before the job is dead-lettered (default: the worker's).
    :param backoff: retry backoff: int ms (fixed), a ``BackoffSpec`` or its dict form.
    :param priority: an int, 1 the most urgent: lower numbers run first, FIFO within one; not
        with ``delay``, ``run_at``, ``job_id`` or ``unique`` (docs/flow-control.md).
    :param group: the job's group (a tenant): groups with waiting jobs take turns, under their
        own limits (``Queue.set_group_limits``); the same exclusions as ``priority``. (templated)
    :param timeout_ms: stop each attempt of the job after this many milliseconds (it fails with
        reason ``timeout`` and follows the retry policy; docs/running-jobs.md).
    :param dedup_id: deduplicate by this id (``Queue.add(dedup_id=)``): with ``dedup_mode``
        ``"throttle"`` a repeat within ``dedup_ttl_ms`` adds nothing and the task gets the first
        job; with ``"debounce"`` the job waits ``dedup_ttl_ms`` and a repeat meanwhile replaces
        its data.  Not with ``delay``, ``run_at``, ``job_id``, ``unique``, ``priority`` or
        ``group``. (templated)
    :param dedup_mode: ``"throttle"`` (default) or ``"debounce"``.
    :param dedup_ttl_ms: how long a dedup id holds, in milliseconds (needed with ``dedup_id``).
    :param wait_for_result: wait for the job and return the handler's result.
    :param wait_timeout: give up waiting after this long (``timedelta`` or seconds); None = no limit.
    :param deferrable: wait in the triggerer (default: ``[operators] default_deferrable``, False
        unless configured, or ``[chasqui] default_deferrable`` when set; see
        :func:`~airflow_provider_chasqui.operators._common.default_deferrable`).
    :param cancel_on_kill: when the task is killed while waiting, cancel the job (waiting, delayed or
        running: ``Queue.cancel``).
    :param wait_chunk_secs: longest single blocking wait on Redis.

    .. seealso:: :class:`~airflow_provider_chasqui.sensors.job.ChasquiJobSensor` to wait for
        jobs added elsewhere.
    """

    template_fields: Sequence[str] = (
        "job_name",
        "data",
        "queue_name",
        "chasqui_conn_id",
        "run_at",
        "job_id",
        "unique_key",
        "group",
        "dedup_id",
    )
    template_fields_renderers = {"data": "json"}
    ui_color = "#f4d35e"
    operator_extra_links = (ChasquiJobLink(),)

    def __init__(
        self,
        *,
        job_name: str,
        data: Any = None,
        queue_name: str | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        delay: timedelta | float | None = None,
        run_at: datetime | str | None = None,
        job_id: str | None = None,
        unique: bool = False,
        unique_key: str | None = None,
        unique_window: timedelta | float | None = None,
        attempts: int | None = None,
        backoff: int | BackoffSpec | Mapping[str, Any] | None = None,
        priority: int | None = None,
        group: str | None = None,
        timeout_ms: int | float | None = None,
        dedup_id: str | None = None,
        dedup_mode: str = "throttle",
        dedup_ttl_ms: int | float | None = None,
        wait_for_result: bool = False,
        wait_timeout: timedelta | float | None = None,
        deferrable: bool | None = None,
        cancel_on_kill: bool = True,
        wait_chunk_secs: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if delay is not None and run_at is not None:
            raise ValueError("give delay or run_at, not both")
        if not unique and (unique_key is not None or unique_window is not None):
            raise ValueError("unique_key and unique_window need unique=True")
        if not wait_for_result and wait_timeout is not None:
            raise ValueError("wait_timeout needs wait_for_result=True")
        build_retry_override(attempts, backoff)  # a bad value fails at parse time, not at run time
        placed = {"delay": delay, "run_at": run_at, "job_id": job_id, "unique": unique or None}
        _check_lanes(placed, priority, group, dedup_id, dedup_mode, dedup_ttl_ms)
        self.dedup_id, self.dedup_mode, self.dedup_ttl_ms = dedup_id, dedup_mode, dedup_ttl_ms
        self.priority = priority
        self.group = group
        self.timeout_ms = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        self.job_name = job_name
        self.data = data
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id
        self.delay = as_seconds(delay, "delay")
        self.run_at = run_at
        self.job_id = job_id
        self.unique = unique
        self.unique_key = unique_key
        window = as_seconds(unique_window, "unique_window")
        self.unique_window = 3600.0 if window is None else window
        self.attempts = attempts
        self.backoff = backoff.to_dict() if isinstance(backoff, BackoffSpec) else backoff
        self.wait_for_result = wait_for_result
        self.wait_timeout = as_seconds(wait_timeout, "wait_timeout")
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.cancel_on_kill = cancel_on_kill
        self.wait_chunk_secs = chunk_seconds(wait_chunk_secs)
        self._queue: SyncQueue | None = None
        self._job_id: str | None = None

    def _enqueue(self, queue: SyncQueue) -> Job:
        when: Any = as_datetime(self.run_at, "run_at")
        if when is None and self.delay:
            when = timedelta(seconds=self.delay)
        common = {"delay": when, "attempts": self.attempts, "backoff": self.backoff, "timeout_ms": self.timeout_ms}
        if self.unique:
            return queue.add_unique(
                self.job_name,
                self.data,
                job_id=self.job_id or None,
                key=self.unique_key or None,
                window=timedelta(seconds=self.unique_window),
                **common,
            )
        if self.dedup_id is not None:
            return queue.add(
                self.job_name,
                self.data,
                dedup_id=self.dedup_id,
                dedup_mode=self.dedup_mode,
                dedup_ttl_ms=self.dedup_ttl_ms,
                attempts=self.attempts,
                backoff=self.backoff,
                timeout_ms=self.timeout_ms,
            )
        if self.priority is not None or self.group:
            return queue.add(
                self.job_name,
                self.data,
                priority=self.priority,
                group=self.group or None,
                attempts=self.attempts,
                backoff=self.backoff,
                timeout_ms=self.timeout_ms,
            )
        return queue.add(self.job_name, self.data, job_id=self.job_id or None, **common)

    def execute(self, context: Context) -> Any:
        # OpenTelemetry (CHASQUI_OTEL=1): the add happens within the task's span; a deferral carries it on
        with tracing.airflow_task_span(context) as traceparent:
            return self._execute(context, traceparent)

    def _execute(self, context: Context, traceparent: str | None) -> Any:
        hook = ChasquiHook(self.chasqui_conn_id)
        with hook.get_queue(self.queue_name) as queue:
            job = self._enqueue(queue)
            queue_name = queue.name
            record_origin(queue, context, job_ids=[job.id])
        self._job_id = job.id
        self.log.info(
            "queue %s: enqueued job %s (%s)%s%s",
            queue_name,
            job.id,
            self.job_name,
            self._when_text(),
            "; waiting for its result" if self.wait_for_result else "",
        )
        context["ti"].xcom_push(key="job_id", value=job.id)
        if traceparent:  # a sensor waiting on this job continues this trace
            context["ti"].xcom_push(key=tracing.TRACE_XCOM_KEY, value=traceparent)
        if not self.wait_for_result:
            return job.id
        deadline = None if self.wait_timeout is None else time.time() + self.wait_timeout
        if not self.deferrable:
            return self._wait_blocking(hook, queue_name, job.id, deadline)
        trigger = ChasquiJobTrigger(
            job_ids=[job.id],
            queue_name=queue_name,
            chasqui_conn_id=self.chasqui_conn_id,
            deadline=deadline,
            wait_chunk_secs=self.wait_chunk_secs,
            cancel_on_kill=self.cancel_on_kill,
            traceparent=traceparent,
        )
        timeout = None if self.wait_timeout is None else timedelta(seconds=self.wait_timeout)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)

    def _when_text(self) -> str:
        if self.run_at:
            return f", to run at {self.run_at}"
        return f", delayed {self.delay:g} s" if self.delay else ""

    def _wait_blocking(self, hook: ChasquiHook, queue_name: str, job_id: str, deadline: float | None) -> Any:
        self._queue = queue = hook.get_queue(queue_name)
        started = time.monotonic()
        try:
            while True:
                chunk = self.wait_chunk_secs if deadline is None else min(self.wait_chunk_secs, deadline - time.time())
                if chunk <= 0:
                    event: dict[str, Any] = {"status": "timeout", "pending": [job_id], "queue": queue_name}
                    log_outcome(self.log, queue, event, [job_id], waited_seconds(None, started))
                    return result_from_event(event, [job_id], True)
                outcomes = queue.wait_for_results([job_id], timeout=chunk)
                if job_id in outcomes:
                    event = first_error([job_id], outcomes, queue_name) or {
                        "status": "success",
                        "results": {job_id: outcomes[job_id].value},
                        "queue": queue_name,
                    }
                    log_outcome(self.log, queue, event, [job_id], waited_seconds(None, started))
                    return result_from_event(event, [job_id], True)
        finally:
            self._queue = None
            queue.close()

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired: the handler's result, or the failure.

        The job id comes from the event (its one result), not from defer kwargs, which
        ``dag.test()`` drops (it resumes with ``{"event": ...}`` only).
        """
        log_resumed(self.log, self.chasqui_conn_id, self.queue_name, event, None, context)
        with tracing.resume_span(event, self.task_id):
            return result_from_event(event, None, True)

    def on_kill(self) -> None:
        """Stop a blocking wait; with ``cancel_on_kill``, cancel the job (``Queue.cancel``: a
        delayed or waiting one never runs, a running async handler is cancelled)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.close()
        if self.cancel_on_kill and self._job_id is not None:
            with ChasquiHook(self.chasqui_conn_id).get_queue(self.queue_name) as q:
                state = q.cancel(self._job_id)
                self.log.info("queue %s: cancel of job %s: %s", q.name, self._job_id, state)
